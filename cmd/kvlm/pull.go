package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/kvlm/kvlm/hub"
	"github.com/spf13/cobra"
)

func newPull() *cobra.Command {
	var dir, sum string
	var force, quiet bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "pull hf://OWNER/REPO/FILE.gguf | URL",
		Short: "Download a model file into the model directory (resumable, size and sha256 checked)",
		Long: "Download a model file from the Hugging Face hub (hf://OWNER/REPO/FILE, hf://OWNER/REPO@REV/FILE) or an\n" +
			"http(s) URL into the model directory ($KVLM_MODELS, default kvlm/models under the user cache\n" +
			"directory): hub files go to hf/OWNER/REPO/REV/FILE, URLs to url/HOST/PATH. An interrupted download\n" +
			"is resumed by pulling again. The hub's published size and sha256 (LFS files) are checked; a\n" +
			"mismatch deletes the partial file. A file already present is kept only if its size and sha256 (when\n" +
			"one is known) match, else it is downloaded again. A server silent for --timeout (connecting, in the\n" +
			"TLS handshake, before its headers or in the middle of the body) ends the pull with an error.\n" +
			"$HF_TOKEN is sent to the hub for gated models; $KVLM_HF_ENDPOINT (or $HF_ENDPOINT) replaces\n" +
			"https://huggingface.co. The progress bar is drawn only on a terminal.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := hub.Parse(args[0])
			if err != nil {
				return err
			}
			if dir == "" {
				if dir, err = hub.Dir(); err != nil {
					return err
				}
			}
			opt := hub.Options{Dir: dir, SHA256: sum, Force: force, Token: os.Getenv("HF_TOKEN")}
			if cmd.Flags().Changed("timeout") {
				if timeout <= 0 {
					return fmt.Errorf("--timeout must be positive, got %v", timeout)
				}
				opt.Timeouts = hub.Timeouts{Connect: timeout, TLSHandshake: timeout, ResponseHeader: timeout, Idle: timeout}
			}
			if !quiet {
				opt.Progress = cmd.ErrOrStderr()
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			res, err := hub.Pull(ctx, ref, opt)
			if err != nil {
				return err
			}
			errw := cmd.ErrOrStderr()
			if res.Replaced != "" {
				fmt.Fprintf(errw, "downloaded again: %s\n", res.Replaced)
			}
			if res.Adopted != "" && !res.Skipped {
				fmt.Fprintf(errw, "continued the old layout's partial download %s\n", res.Adopted)
			}
			switch {
			case res.Adopted != "" && res.Skipped:
				fmt.Fprintf(errw, "moved %s (sha256 %s verified) from the old layout\n", res.Adopted, res.SHA256)
			case res.Skipped && res.Verified:
				fmt.Fprintf(errw, "already present (%s), sha256 %s verified\n", hub.HumanBytes(res.Size), res.SHA256)
			case res.Skipped:
				fmt.Fprintf(errw, "already present (%s; no sha256 published to check it against)\n", hub.HumanBytes(res.Size))
			case res.Verified:
				fmt.Fprintf(errw, "%s, sha256 %s verified\n", hub.HumanBytes(res.Size), res.SHA256)
			default:
				fmt.Fprintf(errw, "%s, sha256 %s (none published to check against)\n", hub.HumanBytes(res.Size), res.SHA256)
			}
			if res.Resumed > 0 && !res.Skipped {
				fmt.Fprintf(errw, "resumed after %s\n", hub.HumanBytes(res.Resumed))
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), res.Path)
			return err
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "model directory (default $KVLM_MODELS or the user cache directory)")
	c.Flags().StringVar(&sum, "sha256", "", "expected sha256 of the file (overrides the hub's)")
	c.Flags().BoolVar(&force, "force", false, "download again even if the file is present")
	c.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	c.Flags().DurationVar(&timeout, "timeout", 0, fmt.Sprintf("give up on a server silent this long at any stage: connecting, TLS, headers, between body bytes (default %v to connect and for TLS, %v for headers and body)", hub.DefaultTimeouts.Connect, hub.DefaultTimeouts.Idle))
	return c
}
