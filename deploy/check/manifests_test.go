package check

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

const manifests = "../k8s"

// load decodes every manifest file; a file that does not decode fails the
// test.
func load(t *testing.T) []Object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(manifests, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", manifests, err)
	}
	var all []Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := Decode(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		all = append(all, objs...)
	}
	return all
}

func TestManifestsDecodeStrictly(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(manifests, "*.yaml"))
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := Decode(data)
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) == 0 {
				t.Fatal("no document")
			}
		})
	}
	kinds := map[string]int{}
	for _, o := range load(t) {
		kinds[o.Kind]++
	}
	for _, k := range []string{"Deployment", "Service", "ConfigMap", "NetworkPolicy", "InferencePool", "InferenceObjective", "HTTPRoute"} {
		if kinds[k] == 0 {
			t.Errorf("no %s among the manifests", k)
		}
	}
}

// The strict decoding and the validation refuse what a cluster would.
func TestDecodeRejects(t *testing.T) {
	pool := "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata:\n  name: p\nspec:\n  selector:\n    matchLabels:\n      app: kvlm\n"
	cases := []struct {
		name, doc, want string
	}{
		{"unknown Deployment field", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  replica: 3\n", `unknown field "spec.replica"`},
		{"unknown container field", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          readinesProbe: {}\n", `unknown field`},
		{"wrong type", "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\nspec:\n  ports: 8000\n", "cannot unmarshal"},
		{"duplicate field", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: x\n  a: y\n", "already set"},
		{"unknown HTTPRoute field", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: r\nspec:\n  rules:\n    - backendRef: {}\n", `unknown field`},
		{"the old InferencePool group", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferencePool\nmetadata:\n  name: p\n", "not one this check knows"},
		{"the old InferencePool field", pool + "  targetPortNumber: 8000\n", `unknown field "spec.targetPortNumber"`},
		{"InferencePool without targetPorts", pool, "spec.targetPorts needs 1 to 8 ports"},
		{"InferencePool port out of range", pool + "  targetPorts:\n    - number: 70000\n", "not a port number"},
		{"InferencePool port twice", pool + "  targetPorts:\n    - number: 8000\n    - number: 8000\n", "twice"},
		{"endpoint picker Service without port", pool + "  targetPorts:\n    - number: 8000\n  endpointPickerRef:\n    name: epp\n", "port is required"},
		{"endpoint picker failure mode", pool + "  targetPorts:\n    - number: 8000\n  endpointPickerRef:\n    name: epp\n    port:\n      number: 9002\n    failureMode: Open\n", "failureMode"},
		{"app protocol", pool + "  targetPorts:\n    - number: 8000\n  appProtocol: grpc\n", "appProtocol"},
		{"InferenceObjective without pool", "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata:\n  name: o\nspec:\n  priority: 1\n", "spec.poolRef.name"},
		{"InferenceObjective unknown field", "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata:\n  name: o\nspec:\n  criticality: Critical\n  poolRef:\n    name: p\n", `unknown field "spec.criticality"`},
		{"no name", "apiVersion: v1\nkind: Service\nspec: {}\n", "no metadata.name"},
		{"unknown kind", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n", "not one this check knows"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode([]byte(c.doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Decode: %v, want an error with %q", err, c.want)
			}
		})
	}
	// And the same documents, fixed, decode (so the cases fail for the
	// reason given).
	good := []string{
		"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  replicas: 3\n",
		pool + "  targetPorts:\n    - number: 8000\n  endpointPickerRef:\n    name: epp\n    port:\n      number: 9002\n    failureMode: FailOpen\n",
		"apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata:\n  name: o\nspec:\n  priority: 1\n  poolRef:\n    name: p\n",
	}
	for _, doc := range good {
		if _, err := Decode([]byte(doc)); err != nil {
			t.Errorf("Decode(%q): %v", doc, err)
		}
	}
}

func byKind[T any](all []Object) map[string]*T {
	out := map[string]*T{}
	for _, o := range all {
		if v, ok := o.Value.(*T); ok {
			out[o.Name] = v
		}
	}
	return out
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// containerPort resolves a probe's or a Service's port (a number or a
// container port's name) in a pod.
func containerPort(pod corev1.PodSpec, p intstr.IntOrString) int32 {
	for _, c := range pod.Containers {
		for _, cp := range c.Ports {
			if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
				return cp.ContainerPort
			}
		}
	}
	return 0
}

// flags parses a container's kvlm arguments: --name=value or --name value.
func flags(args []string) map[string][]string {
	out := map[string][]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name, value, ok := strings.Cut(a[2:], "=")
		if !ok && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			value = args[i+1]
			i++
		}
		out[name] = append(out[name], value)
	}
	return out
}

func kvlmDeployment(t *testing.T, all []Object) *appsv1.Deployment {
	t.Helper()
	d := byKind[appsv1.Deployment](all)["kvlm"]
	if d == nil {
		t.Fatal("no Deployment kvlm")
	}
	return d
}

func TestManifestsAgree(t *testing.T) {
	all := load(t)
	deployments := byKind[appsv1.Deployment](all)
	kvlm := kvlmDeployment(t, all)
	pod := kvlm.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("kvlm pods have %d containers, want 1", len(pod.Containers))
	}
	args := flags(pod.Containers[0].Args)

	t.Run("deployments select their pods", func(t *testing.T) {
		for name, d := range deployments {
			if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
				t.Errorf("Deployment %s: selector %v does not select its pods %v", name, d.Spec.Selector, d.Spec.Template.Labels)
			}
		}
	})
	t.Run("services select pods on their ports", func(t *testing.T) {
		for name, s := range byKind[corev1.Service](all) {
			var target *appsv1.Deployment
			for _, d := range deployments {
				if selects(s.Spec.Selector, d.Spec.Template.Labels) {
					target = d
				}
			}
			if target == nil {
				t.Errorf("Service %s selects no Deployment's pods", name)
				continue
			}
			for _, p := range s.Spec.Ports {
				if containerPort(target.Spec.Template.Spec, p.TargetPort) == 0 {
					t.Errorf("Service %s: targetPort %s is no container port of %s", name, p.TargetPort.String(), target.Name)
				}
			}
		}
	})
	t.Run("kvlm probes /health on its port", func(t *testing.T) {
		c := pod.Containers[0]
		for what, p := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" {
				t.Errorf("%s is not an HTTP GET of /health: %+v", what, p)
				continue
			}
			if got := containerPort(pod, p.HTTPGet.Port); got == 0 || "0.0.0.0:"+itoa(got) != args["addr"][0] {
				t.Errorf("%s: port %s, kvlm listens on %v", what, p.HTTPGet.Port.String(), args["addr"])
			}
		}
	})
	t.Run("kvlm waits out of the pool before SIGTERM", func(t *testing.T) {
		l := pod.Containers[0].Lifecycle
		if l == nil || l.PreStop == nil || l.PreStop.Sleep == nil {
			t.Fatal("no preStop sleep: SIGTERM would end the requests in flight while the pod is still in the pool")
		}
		grace := int64(30) // Kubernetes' default
		if pod.TerminationGracePeriodSeconds != nil {
			grace = *pod.TerminationGracePeriodSeconds
		}
		if l.PreStop.Sleep.Seconds >= grace {
			t.Errorf("preStop sleeps %d s of a %d s grace period: nothing left for kvlm to stop", l.PreStop.Sleep.Seconds, grace)
		}
	})
	t.Run("the model volume is mounted read-only", func(t *testing.T) {
		model := args["model"]
		if len(model) != 1 {
			t.Fatalf("--model %v", model)
		}
		ok := false
		for _, m := range pod.Containers[0].VolumeMounts {
			if strings.HasPrefix(model[0], m.MountPath+"/") && m.ReadOnly {
				for _, v := range pod.Volumes {
					ok = ok || (v.Name == m.Name && v.PersistentVolumeClaim != nil)
				}
			}
		}
		if !ok {
			t.Errorf("--model %s is on no read-only volume of a PersistentVolumeClaim", model[0])
		}
	})
	t.Run("the shared tier is the Redis Service, its password a Secret", func(t *testing.T) {
		store := args["kv-store"]
		m := regexp.MustCompile(`^redis://([a-z0-9-]+):(\d+)(/\d+)?$`).FindStringSubmatch(strings.Join(store, ""))
		if len(store) != 1 || m == nil {
			t.Fatalf("--kv-store %v is not redis://SERVICE:PORT[/DB]", store)
		}
		svc := byKind[corev1.Service](all)[m[1]]
		if svc == nil || len(svc.Spec.Ports) == 0 || itoa(svc.Spec.Ports[0].Port) != m[2] {
			t.Errorf("--kv-store %s: no Service %s on port %s", store[0], m[1], m[2])
		}
		var secret bool
		for _, e := range pod.Containers[0].Env {
			secret = secret || (e.Name == "KVLM_KV_STORE_PASSWORD" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil)
		}
		if !secret {
			t.Error("no KVLM_KV_STORE_PASSWORD from a Secret")
		}
		if len(args["kv-store-password"]) > 0 {
			t.Error("the Redis password is on the command line")
		}
	})
	t.Run("Redis is bounded and evicts LRU", func(t *testing.T) {
		cm := byKind[corev1.ConfigMap](all)["kvlm-redis"]
		if cm == nil {
			t.Fatal("no ConfigMap kvlm-redis")
		}
		conf := cm.Data["redis.conf"]
		for _, want := range []string{`(?m)^maxmemory \d+[kmg]b$`, `(?m)^maxmemory-policy allkeys-lru$`, `(?m)^save ""$`, `(?m)^appendonly no$`} {
			if !regexp.MustCompile(want).MatchString(conf) {
				t.Errorf("redis.conf lacks %s", want)
			}
		}
		redis := deployments["kvlm-redis"]
		if redis == nil {
			t.Fatal("no Deployment kvlm-redis")
		}
		mounted := false
		for _, v := range redis.Spec.Template.Spec.Volumes {
			mounted = mounted || (v.ConfigMap != nil && v.ConfigMap.Name == cm.Name)
		}
		c := redis.Spec.Template.Spec.Containers[0]
		if !mounted || len(c.Args) < 2 || c.Args[1] != "/etc/redis/redis.conf" {
			t.Errorf("Redis does not read the ConfigMap: volumes %v, args %v", redis.Spec.Template.Spec.Volumes, c.Args)
		}
	})
	t.Run("the pool selects kvlm's pods on its port", func(t *testing.T) {
		pools := byKind[InferencePool](all)
		if len(pools) == 0 {
			t.Fatal("no InferencePool")
		}
		for name, p := range pools {
			if !selects(p.Spec.Selector.MatchLabels, kvlm.Spec.Template.Labels) {
				t.Errorf("InferencePool %s: selector %v does not select kvlm's pods %v", name, p.Spec.Selector.MatchLabels, kvlm.Spec.Template.Labels)
			}
			for _, tp := range p.Spec.TargetPorts {
				if containerPort(pod, intstr.FromInt32(tp.Number)) == 0 {
					t.Errorf("InferencePool %s: target port %d is no container port of kvlm", name, tp.Number)
				}
			}
			if p.Spec.EndpointPickerRef == nil {
				t.Errorf("InferencePool %s names no endpoint picker", name)
			}
		}
		for name, o := range byKind[InferenceObjective](all) {
			r := o.Spec.PoolRef
			if pools[r.Name] == nil || (r.Group != "" && r.Group != "inference.networking.k8s.io") || (r.Kind != "" && r.Kind != "InferencePool") {
				t.Errorf("InferenceObjective %s: poolRef %+v names no InferencePool here", name, r)
			}
		}
	})
	t.Run("the route leads to the pool, its hosts allowed", func(t *testing.T) {
		pools := byKind[InferencePool](all)
		routes := byKind[gatewayv1.HTTPRoute](all)
		if len(routes) == 0 {
			t.Fatal("no HTTPRoute")
		}
		allowed := map[string]bool{}
		for _, v := range args["allowed-hosts"] {
			for _, h := range strings.Split(v, ",") {
				allowed[h] = true
			}
		}
		for name, r := range routes {
			for _, h := range r.Spec.Hostnames {
				if !allowed[string(h)] && !allowed["*"] {
					t.Errorf("HTTPRoute %s: hostname %s is not in kvlm's --allowed-hosts %v (kvlm would refuse it: 403)", name, h, args["allowed-hosts"])
				}
			}
			for _, rule := range r.Spec.Rules {
				for _, b := range rule.BackendRefs {
					if b.Group == nil || string(*b.Group) != "inference.networking.k8s.io" || b.Kind == nil || string(*b.Kind) != "InferencePool" || pools[string(b.Name)] == nil {
						t.Errorf("HTTPRoute %s: backend %s is no InferencePool here", name, b.Name)
					}
				}
			}
		}
	})
	t.Run("the network policy admits kvlm's ports", func(t *testing.T) {
		for name, np := range byKind[networkingv1.NetworkPolicy](all) {
			if !selects(np.Spec.PodSelector.MatchLabels, kvlm.Spec.Template.Labels) {
				continue
			}
			for _, rule := range np.Spec.Ingress {
				for _, p := range rule.Ports {
					if p.Port == nil || containerPort(pod, *p.Port) == 0 {
						t.Errorf("NetworkPolicy %s: port %v is no container port of kvlm", name, p.Port)
					}
				}
			}
		}
	})
	t.Run("every $(VAR) in arguments is an env var of the container", func(t *testing.T) {
		for name, d := range deployments {
			for _, c := range d.Spec.Template.Spec.Containers {
				env := map[string]bool{}
				for _, e := range c.Env {
					env[e.Name] = true
				}
				for _, a := range c.Args {
					for _, m := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(a, -1) {
						if !env[m[1]] {
							t.Errorf("Deployment %s: argument %q names $(%s), which is no env var (Kubernetes would pass it as it is)", name, a, m[1])
						}
					}
				}
			}
		}
	})
	t.Run("every kvlm flag exists", func(t *testing.T) {
		if pod.Containers[0].Args[0] != "serve" {
			t.Fatalf("kvlm's first argument is %q, want serve", pod.Containers[0].Args[0])
		}
		help := serveHelp(t)
		for name := range args {
			if !regexp.MustCompile(`(?m)^\s+(-\w, )?--` + regexp.QuoteMeta(name) + `\b`).MatchString(help) {
				t.Errorf("kvlm serve has no flag --%s", name)
			}
		}
	})
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// serveHelp is `kvlm serve --help` of $KVLM_BIN, or of the kvlm built from
// this repository.
func serveHelp(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("KVLM_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "kvlm")
		build := exec.Command("go", "build", "-o", bin, "./cmd/kvlm")
		build.Dir = "../.."
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/kvlm: %v\n%s", err, out)
		}
	}
	out, err := exec.Command(bin, "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("kvlm serve --help: %v\n%s", err, out)
	}
	return string(out)
}
