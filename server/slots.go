package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvlm/kvlm/engine"
)

// Slot files: POST /v1/slots/{id}?action=save|restore with
// {"filename": "name.bin"}, or ?action=erase. Names are plain file names
// (letters, digits, '.', '_', '-', not starting with '.') inside --slot-dir;
// a save is written to a temporary file, synced and renamed, so a crash
// never leaves half a file under the name; the file ends with a SHA-256 of
// its content and names the model it came from, and restore refuses a
// corrupt file or one from another model. A slot holds a sequence under
// any policy and codecs, compressed as it is (engine/slotv2.go).

var slotName = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$`)

type slotRequest struct {
	Filename string `json:"filename"`
}

func (s *Server) listSlots(w http.ResponseWriter, r *http.Request) {
	infos, err := s.e.Slots()
	if err != nil {
		writeError(w, engineError(err))
		return
	}
	if infos == nil {
		infos = []engine.SlotInfo{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": infos})
}

func (s *Server) slotAction(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil || id < 0 || id >= engine.MaxSlots {
		writeError(w, badRequest("id", "slot id must be an integer between 0 and %d, got %q", engine.MaxSlots-1, r.PathValue("id")))
		return
	}
	action := r.URL.Query().Get("action")
	switch action {
	case "erase":
		if err := s.e.EraseSlot(id); err != nil {
			writeError(w, engineError(err))
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"id_slot": id, "action": action})
		return
	case "save", "restore":
	default:
		writeError(w, badRequest("action", "action must be save, restore or erase, got %q", action))
		return
	}
	if s.opt.SlotDir == "" {
		writeError(w, &apiError{status: http.StatusNotImplemented, msg: "slot files are disabled: start the server with --slot-dir DIR", typ: "invalid_request_error"})
		return
	}
	var req slotRequest
	if aerr := s.decodeBody(w, r, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	if !slotName.MatchString(req.Filename) {
		writeError(w, badRequest("filename", "filename must be 1–128 letters, digits, '.', '_' or '-', not starting with '.', got %q", req.Filename))
		return
	}
	path := filepath.Join(s.opt.SlotDir, req.Filename)
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		writeError(w, &apiError{status: http.StatusConflict, msg: fmt.Sprintf("%q in the slot directory is not a regular file", req.Filename),
			typ: "invalid_request_error", param: "filename"})
		return
	}
	if action == "save" {
		n, info, err := s.saveSlot(id, path)
		if err != nil {
			writeError(w, slotError(err, "write"))
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"id_slot": id, "filename": req.Filename, "n_saved": info.Tokens, "n_written": n})
		return
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			writeError(w, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no slot file %q", req.Filename), typ: "invalid_request_error", param: "filename"})
			return
		}
		writeError(w, slotError(err, "open"))
		return
	}
	defer f.Close()
	cr := &countReader{r: f}
	info, err := s.e.RestoreSlot(id, cr)
	if err != nil {
		writeError(w, slotError(err, "read"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id_slot": id, "filename": req.Filename, "n_restored": info.Tokens, "n_read": cr.n})
}

// saveSlot writes slot id to path atomically: a temporary file in the same
// directory, synced, then renamed over path, and the directory synced.
func (s *Server) saveSlot(id int, path string) (int64, engine.SlotInfo, error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, tmpPrefix+"*"+tmpSuffix)
	if err != nil {
		return 0, engine.SlotInfo{}, err
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	cw := &countWriter{w: tmp}
	info, err := s.e.SaveSlot(id, cw)
	if err != nil {
		return 0, info, err
	}
	if err := tmp.Sync(); err != nil {
		return 0, info, err
	}
	if err := tmp.Close(); err != nil {
		return 0, info, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return 0, info, err
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return cw.n, info, nil
}

// The temporary files of saves in progress: .slot-*.tmp.
const tmpPrefix, tmpSuffix = ".slot-", ".tmp"

// removeOrphans deletes the temporary files a save interrupted by a crash
// left in the slot directory (a running save's file would go too: a slot
// directory belongs to one server).
func (s *Server) removeOrphans() {
	entries, err := os.ReadDir(s.opt.SlotDir)
	if err != nil {
		s.log.Printf("kvlm server: cannot read the slot directory: %v", err)
		return
	}
	n := 0
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, tmpPrefix) || !strings.HasSuffix(name, tmpSuffix) {
			continue
		}
		if err := os.Remove(filepath.Join(s.opt.SlotDir, name)); err != nil {
			s.log.Printf("kvlm server: cannot remove the orphaned slot file %s: %v", name, err)
			continue
		}
		n++
	}
	if n > 0 {
		s.log.Printf("kvlm server: removed %d orphaned temporary slot file(s) (%s*%s)", n, tmpPrefix, tmpSuffix)
	}
}

// slotError maps the error of a slot file operation (op: open, read or
// write): the engine's errors through engineError, the file system's
// without their paths (no server path reaches a client).
func slotError(err error, op string) *apiError {
	var ie *engine.InvalidError
	switch {
	case errors.As(err, &ie), errors.Is(err, engine.ErrNoSlot), errors.Is(err, engine.ErrClosed), errors.As(err, new(*engine.CapacityError)):
		return engineError(err)
	}
	var pe *os.PathError
	var le *os.LinkError
	var errno error
	switch {
	case errors.As(err, &pe):
		errno = pe.Err
	case errors.As(err, &le):
		errno = le.Err
	}
	switch {
	case errno == nil:
		// An engine error about the slot's state (its tables could not
		// be read); engine messages hold no paths.
		return &apiError{status: http.StatusConflict, msg: err.Error(), typ: "invalid_request_error"}
	case errors.Is(errno, syscall.EISDIR), errors.Is(errno, syscall.ENOTDIR), errors.Is(errno, syscall.EEXIST), errors.Is(errno, syscall.ENOTEMPTY):
		return &apiError{status: http.StatusConflict, msg: fmt.Sprintf("cannot %s the slot file: %v", op, errno), typ: "invalid_request_error", param: "filename"}
	case errors.Is(errno, os.ErrPermission):
		return &apiError{status: http.StatusForbidden, msg: fmt.Sprintf("cannot %s the slot file: permission denied", op), typ: "permission_error", param: "filename"}
	}
	return &apiError{status: http.StatusInternalServerError, msg: fmt.Sprintf("cannot %s the slot file: %v", op, errno), typ: "server_error"}
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
