package deploy_test

import (
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	k8syaml "sigs.k8s.io/yaml"

	"github.com/paystream/paystream/internal/envelope"
)

const (
	baseDir    = "k8s/base"
	exampleDir = "k8s/overlays/example"
	// exampleImage is the image the example overlay sets.
	exampleImage = "registry.example.com/paystream:1.0.0"
)

// scaledObject is the part of KEDA's ScaledObject the manifests use.
type scaledObject struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Metadata   metav1ObjectMeta `json:"metadata"`
	Spec       scaledObjectSpec `json:"spec"`
}

type metav1ObjectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type scaledObjectSpec struct {
	ScaleTargetRef struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Name       string `json:"name"`
	} `json:"scaleTargetRef"`
	MinReplicaCount int32 `json:"minReplicaCount"`
	MaxReplicaCount int32 `json:"maxReplicaCount"`
	PollingInterval int32 `json:"pollingInterval"`
	CooldownPeriod  int32 `json:"cooldownPeriod"`
	Advanced        struct {
		HorizontalPodAutoscalerConfig struct {
			Behavior autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior"`
		} `json:"horizontalPodAutoscalerConfig"`
	} `json:"advanced"`
	Triggers []struct {
		Type     string            `json:"type"`
		Metadata map[string]string `json:"metadata"`
	} `json:"triggers"`
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// the manifests use.
type serviceMonitor struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Metadata   metav1ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// workload is a Deployment, StatefulSet or Job, reduced to what the checks need.
type workload struct {
	Kind, Name string
	Replicas   *int32
	Pod        corev1.PodTemplateSpec
}

// rendered is a kustomization built with kustomize's own library and every
// object decoded strictly into its Kubernetes API type.
type rendered struct {
	Workloads       []workload
	Services        []corev1.Service
	ConfigMaps      map[string]corev1.ConfigMap
	Secrets         map[string]corev1.Secret
	HPAs            []autoscalingv2.HorizontalPodAutoscaler
	PDBs            []policyv1.PodDisruptionBudget
	NetworkPolicies []networkingv1.NetworkPolicy
	ScaledObjects   []scaledObject
	ServiceMonitors []serviceMonitor
	Kinds           []string
}

// render builds the kustomization in dir (relative to deploy/) as
// `kubectl kustomize` does and decodes each object strictly: a misspelled
// field fails.
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	r := &rendered{ConfigMaps: map[string]corev1.ConfigMap{}, Secrets: map[string]corev1.Secret{}}
	for _, res := range resMap.Resources() {
		doc, err := res.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		kind := res.GetKind()
		r.Kinds = append(r.Kinds, kind+"/"+res.GetName())
		where := fmt.Sprintf("%s: %s %s", dir, kind, res.GetName())
		switch kind {
		case "Deployment":
			d := decodeAs[appsv1.Deployment](t, where, doc)
			r.Workloads = append(r.Workloads, workload{kind, d.Name, d.Spec.Replicas, d.Spec.Template})
		case "StatefulSet":
			s := decodeAs[appsv1.StatefulSet](t, where, doc)
			r.Workloads = append(r.Workloads, workload{kind, s.Name, s.Spec.Replicas, s.Spec.Template})
		case "Job":
			j := decodeAs[batchv1.Job](t, where, doc)
			r.Workloads = append(r.Workloads, workload{kind, j.Name, nil, j.Spec.Template})
		case "Service":
			r.Services = append(r.Services, decodeAs[corev1.Service](t, where, doc))
		case "ConfigMap":
			c := decodeAs[corev1.ConfigMap](t, where, doc)
			r.ConfigMaps[c.Name] = c
		case "Secret":
			s := decodeAs[corev1.Secret](t, where, doc)
			r.Secrets[s.Name] = s
		case "ServiceAccount":
			decodeAs[corev1.ServiceAccount](t, where, doc)
		case "HorizontalPodAutoscaler":
			r.HPAs = append(r.HPAs, decodeAs[autoscalingv2.HorizontalPodAutoscaler](t, where, doc))
		case "PodDisruptionBudget":
			r.PDBs = append(r.PDBs, decodeAs[policyv1.PodDisruptionBudget](t, where, doc))
		case "NetworkPolicy":
			r.NetworkPolicies = append(r.NetworkPolicies, decodeAs[networkingv1.NetworkPolicy](t, where, doc))
		case "ScaledObject":
			r.ScaledObjects = append(r.ScaledObjects, decodeAs[scaledObject](t, where, doc))
		case "ServiceMonitor":
			r.ServiceMonitors = append(r.ServiceMonitors, decodeAs[serviceMonitor](t, where, doc))
		default:
			t.Errorf("%s: no check knows this kind; add it to render", where)
		}
	}
	return r
}

// decodeAs decodes doc strictly as a T: a field T does not have fails the
// test, naming the object (where).
func decodeAs[T any](t *testing.T, where string, doc []byte) T {
	t.Helper()
	var v T
	if err := k8syaml.UnmarshalStrict(doc, &v); err != nil {
		t.Errorf("%s: %v", where, err)
	}
	return v
}

// workload returns the workload running the given paystream command.
func (r *rendered) workload(t *testing.T, command string) workload {
	t.Helper()
	for _, w := range r.Workloads {
		if c := w.Pod.Spec.Containers; len(c) > 0 && len(c[0].Args) > 0 && c[0].Args[0] == command {
			return w
		}
	}
	t.Fatalf("no workload runs paystream %s", command)
	return workload{}
}

// env resolves a container's environment as the kubelet would: envFrom
// ConfigMaps and Secrets first, then env (literal values, secret and
// ConfigMap keys, the pod name). A reference to a missing object or key is
// an error.
func (r *rendered) env(c corev1.Container, podName string) (map[string]string, error) {
	out := map[string]string{}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, ok := r.ConfigMaps[from.ConfigMapRef.Name]
			if !ok {
				return nil, fmt.Errorf("envFrom: no ConfigMap %s", from.ConfigMapRef.Name)
			}
			maps.Copy(out, cm.Data)
		case from.SecretRef != nil:
			s, ok := r.Secrets[from.SecretRef.Name]
			if !ok {
				return nil, fmt.Errorf("envFrom: no Secret %s", from.SecretRef.Name)
			}
			for k, v := range s.Data {
				out[k] = string(v)
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := r.Secrets[ref.Name].Data[ref.Key]
			if !ok {
				return nil, fmt.Errorf("%s: no key %q in Secret %s", e.Name, ref.Key, ref.Name)
			}
			out[e.Name] = string(v)
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			v, ok := r.ConfigMaps[ref.Name].Data[ref.Key]
			if !ok {
				return nil, fmt.Errorf("%s: no key %q in ConfigMap %s", e.Name, ref.Key, ref.Name)
			}
			out[e.Name] = v
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			out[e.Name] = podName
		default:
			return nil, fmt.Errorf("%s: a valueFrom the checks do not know", e.Name)
		}
	}
	return out, nil
}

// volumeKey returns key rel of the data of the ConfigMap or Secret (kind)
// named name that volume mounts, found telling whether it exists.
func volumeKey[V string | []byte](volume, kind, name string, found bool, data map[string]V, rel string) (string, error) {
	if !found {
		return "", fmt.Errorf("volume %s: no %s %s", volume, kind, name)
	}
	v, ok := data[rel]
	if !ok {
		return "", fmt.Errorf("%s %s has no key %s", kind, name, rel)
	}
	return string(v), nil
}

// mountedFile returns the content of the file at path as a ConfigMap or
// Secret volume mounted in the container provides it.
func (r *rendered) mountedFile(pod corev1.PodSpec, c corev1.Container, path string) (string, error) {
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			switch {
			case v.ConfigMap != nil:
				cm, ok := r.ConfigMaps[v.ConfigMap.Name]
				return volumeKey(v.Name, "ConfigMap", v.ConfigMap.Name, ok, cm.Data, rel)
			case v.Secret != nil:
				s, ok := r.Secrets[v.Secret.SecretName]
				return volumeKey(v.Name, "Secret", v.Secret.SecretName, ok, s.Data, rel)
			}
		}
		return "", fmt.Errorf("mount %s is not a ConfigMap or Secret volume", m.Name)
	}
	return "", fmt.Errorf("%s is on no mounted volume", path)
}

// mountedPaths returns the files a container's settings name, each to the
// setting that names it: every PAYSTREAM_*_FILE variable (TLS and SASL of
// Kafka) and the database URL's sslrootcert.
func mountedPaths(env map[string]string) map[string]string {
	out := map[string]string{}
	for name, v := range env {
		if strings.HasPrefix(name, "PAYSTREAM_") && strings.HasSuffix(name, "_FILE") && v != "" {
			out[v] = name
		}
	}
	if u, err := url.Parse(env["PAYSTREAM_DATABASE_URL"]); err == nil {
		if root := u.Query().Get("sslrootcert"); root != "" {
			out[root] = "PAYSTREAM_DATABASE_URL's sslrootcert"
		}
	}
	return out
}

// listenPorts maps each port the container's PAYSTREAM_*_ADDR settings make
// the binary listen on to the variable that sets it.
func listenPorts(env map[string]string) (map[int32]string, error) {
	out := map[int32]string{}
	for _, name := range []string{"PAYSTREAM_HTTP_ADDR", "PAYSTREAM_METRICS_ADDR"} {
		addr, ok := env[name]
		if !ok || addr == "" {
			continue
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", name, addr, err)
		}
		p, err := strconv.ParseInt(port, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", name, addr, err)
		}
		out[int32(p)] = name
	}
	return out, nil
}

// containerPort resolves a probe's or Service's port (a number or a name)
// to the container's port number.
func containerPort(c corev1.Container, port string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == port || strconv.Itoa(int(p.ContainerPort)) == port {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

func probes(c corev1.Container) map[string]*corev1.Probe {
	out := map[string]*corev1.Probe{}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p != nil {
			out[name] = p
		}
	}
	return out
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// sourcesEnvRefs returns the NAMEs of the env:NAME references in a sources file.
func sourcesEnvRefs(t *testing.T, file string) []string {
	t.Helper()
	var doc struct {
		Sources []map[string]any `yaml:"sources"`
	}
	if err := yaml.Unmarshal([]byte(file), &doc); err != nil {
		t.Fatalf("sources file: %v", err)
	}
	var names []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			if name, ok := strings.CutPrefix(v, "env:"); ok {
				names = append(names, name)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	for _, s := range doc.Sources {
		walk(s)
	}
	return names
}

// TestKubernetesManifests renders the base and the example overlay with
// kustomize, decodes every object strictly into its API type, and checks
// the wiring against the binary: each container runs a real command with
// only PAYSTREAM_* variables that command reads (its --help), every Secret,
// ConfigMap and file it references exists, every containerPort is one the
// binary listens on and every probe, Service and scrape port is one of
// them, and the autoscalers, budgets and policies point at real workloads
// and ports. KEDA's bounds match the raw topic and group the processor uses.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	base := render(t, baseDir)
	if len(base.Workloads) != 4 {
		t.Errorf("base: %d workloads, want 4 (migrate, ingest, processor, sink): %v", len(base.Workloads), base.Kinds)
	}
	r := render(t, exampleDir)
	t.Logf("example overlay: %d objects", len(r.Kinds))

	commands := map[string]bool{"migrate": true, "ingest": true, "processor": true, "sink": true}
	for _, w := range r.Workloads {
		where := w.Kind + " " + w.Name
		if len(w.Pod.Spec.Containers) != 1 {
			t.Errorf("%s: %d containers, want 1", where, len(w.Pod.Spec.Containers))
			continue
		}
		c := w.Pod.Spec.Containers[0]
		if c.Image != exampleImage {
			t.Errorf("%s: image %q, want the overlay's %q", where, c.Image, exampleImage)
		}
		if len(c.Args) != 1 || !commands[c.Args[0]] {
			t.Errorf("%s: args %q, want one of the commands %v", where, c.Args, slices.Sorted(maps.Keys(commands)))
			continue
		}
		cmd := c.Args[0]
		if got := w.Pod.Labels["app.kubernetes.io/component"]; got != cmd {
			t.Errorf("%s: component label %q, want %q", where, got, cmd)
		}
		if w.Pod.Spec.SecurityContext == nil || w.Pod.Spec.SecurityContext.RunAsNonRoot == nil || !*w.Pod.Spec.SecurityContext.RunAsNonRoot {
			t.Errorf("%s: pod does not require runAsNonRoot (the image runs as nonroot)", where)
		}
		env, err := r.env(c, w.Name+"-0")
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		reads := commandEnv(t, cmd)
		for name := range env {
			if strings.HasPrefix(name, "PAYSTREAM_") && !slices.Contains(reads, name) {
				t.Errorf("%s: sets %s, which paystream %s does not read (it reads %v)", where, name, cmd, reads)
			}
		}
		if _, ok := env["PAYSTREAM_KAFKA_BROKERS"]; !ok {
			t.Errorf("%s: no PAYSTREAM_KAFKA_BROKERS", where)
		}
		if cmd != "ingest" {
			if _, ok := env["PAYSTREAM_DATABASE_URL"]; !ok {
				t.Errorf("%s: no PAYSTREAM_DATABASE_URL", where)
			}
			for _, e := range c.Env {
				if e.Name == "PAYSTREAM_DATABASE_URL" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
					t.Errorf("%s: PAYSTREAM_DATABASE_URL is not read from a Secret", where)
				}
			}
		}
		// The sources file is mounted, and every env:NAME it names is set.
		if path, ok := env["PAYSTREAM_SOURCES"]; ok {
			file, err := r.mountedFile(w.Pod.Spec, c, path)
			if err != nil {
				t.Errorf("%s: PAYSTREAM_SOURCES=%s: %v", where, path, err)
			} else {
				for _, name := range sourcesEnvRefs(t, file) {
					if _, ok := env[name]; !ok {
						t.Errorf("%s: the sources file names env:%s, which the container does not set", where, name)
					}
				}
			}
		} else if cmd == "ingest" {
			t.Errorf("%s: no PAYSTREAM_SOURCES", where)
		}
		// Kafka's CA, password and token files and Postgres's CA are mounted
		// (a Secret), and no password is set as a plain value.
		for path, setting := range mountedPaths(env) {
			if _, err := r.mountedFile(w.Pod.Spec, c, path); err != nil {
				t.Errorf("%s: %s=%s: %v", where, setting, path, err)
			}
		}
		if _, ok := env["PAYSTREAM_KAFKA_SASL_PASSWORD"]; ok {
			t.Errorf("%s: sets PAYSTREAM_KAFKA_SASL_PASSWORD: mount the password and set PAYSTREAM_KAFKA_SASL_PASSWORD_FILE", where)
		}

		// Ports: what the container declares is what the binary listens on.
		listen, err := listenPorts(env)
		if err != nil {
			t.Errorf("%s: %v", where, err)
		}
		for _, p := range c.Ports {
			if _, ok := listen[p.ContainerPort]; !ok {
				t.Errorf("%s: containerPort %s/%d, but no PAYSTREAM_*_ADDR makes paystream listen there (it listens on %v)", where, p.Name, p.ContainerPort, listen)
			}
		}
		for port, name := range listen {
			if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == port }) {
				t.Errorf("%s: %s listens on %d, which is not a containerPort", where, name, port)
			}
		}
		ps := probes(c)
		if w.Kind != "Job" {
			if ps["liveness"] == nil {
				t.Errorf("%s: no liveness probe", where)
			}
			if len(listen) == 0 {
				t.Errorf("%s: listens nowhere: no probe can reach it", where)
			}
		}
		for kind, p := range ps {
			if p.HTTPGet == nil {
				t.Errorf("%s: %s probe is not an HTTP GET", where, kind)
				continue
			}
			if port, ok := containerPort(c, p.HTTPGet.Port.String()); !ok {
				t.Errorf("%s: %s probe on port %s, which is not a containerPort", where, kind, p.HTTPGet.Port.String())
			} else if _, ok := listen[port]; !ok {
				t.Errorf("%s: %s probe on port %d, where paystream does not listen", where, kind, port)
			}
		}
		// Long-running commands say whether they can work: ingest (broker
		// reachable, not draining), processor and sink (Postgres answers).
		if cmd != "migrate" && (ps["readiness"] == nil || ps["readiness"].HTTPGet.Path != "/readyz") {
			t.Errorf("%s: %s's readiness probe must be GET /readyz", where, cmd)
		}
	}

	// Services select one workload each, on ports its container declares.
	for _, s := range r.Services {
		var matched []workload
		for _, w := range r.Workloads {
			if w.Kind != "Job" && selects(s.Spec.Selector, w.Pod.Labels) {
				matched = append(matched, w)
			}
		}
		if len(matched) != 1 {
			t.Errorf("Service %s selects %d workloads, want 1", s.Name, len(matched))
			continue
		}
		for _, p := range s.Spec.Ports {
			if _, ok := containerPort(matched[0].Pod.Spec.Containers[0], p.TargetPort.String()); !ok {
				t.Errorf("Service %s port %s: targetPort %s is not a port of %s", s.Name, p.Name, p.TargetPort.String(), matched[0].Name)
			}
		}
	}

	// The ServiceMonitor scrapes ingest, processor and sink on their metrics port.
	if len(r.ServiceMonitors) != 1 {
		t.Fatalf("%d ServiceMonitors, want 1", len(r.ServiceMonitors))
	}
	sm := r.ServiceMonitors[0]
	scraped := map[string]bool{}
	for _, s := range r.Services {
		if !selects(sm.Spec.Selector.MatchLabels, s.Labels) {
			continue
		}
		for _, ep := range sm.Spec.Endpoints {
			if slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				scraped[s.Labels["app.kubernetes.io/component"]] = true
			}
		}
	}
	for _, cmd := range []string{"ingest", "processor", "sink"} {
		if !scraped[cmd] {
			t.Errorf("the ServiceMonitor scrapes no %s Service port", cmd)
		}
	}

	// Autoscalers and budgets point at real workloads.
	byName := map[string]workload{}
	for _, w := range r.Workloads {
		byName[w.Kind+"/"+w.Name] = w
	}
	for _, h := range r.HPAs {
		if _, ok := byName[h.Spec.ScaleTargetRef.Kind+"/"+h.Spec.ScaleTargetRef.Name]; !ok {
			t.Errorf("HPA %s scales %s/%s, which does not exist", h.Name, h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name)
		}
	}
	for _, p := range r.PDBs {
		n := 0
		for _, w := range r.Workloads {
			if w.Kind != "Job" && selects(p.Spec.Selector.MatchLabels, w.Pod.Labels) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("PodDisruptionBudget %s covers %d workloads, want 1", p.Name, n)
		}
	}
	for _, cmd := range []string{"ingest", "processor", "sink"} {
		w := r.workload(t, cmd)
		if !slices.ContainsFunc(r.PDBs, func(p policyv1.PodDisruptionBudget) bool { return selects(p.Spec.Selector.MatchLabels, w.Pod.Labels) }) {
			t.Errorf("%s has no PodDisruptionBudget", w.Name)
		}
	}
	ingest := r.workload(t, "ingest")
	if !slices.ContainsFunc(r.HPAs, func(h autoscalingv2.HorizontalPodAutoscaler) bool {
		return h.Spec.ScaleTargetRef.Name == ingest.Name && h.Spec.ScaleTargetRef.Kind == ingest.Kind
	}) {
		t.Errorf("ingest has no HorizontalPodAutoscaler")
	}

	// A workload an autoscaler owns sets no replicas: each `kubectl apply`
	// would reset the count the autoscaler chose.
	for _, rr := range []*rendered{base, r} {
		owners := map[string]string{}
		for _, h := range rr.HPAs {
			owners[h.Spec.ScaleTargetRef.Kind+"/"+h.Spec.ScaleTargetRef.Name] = "HorizontalPodAutoscaler " + h.Name
		}
		for _, so := range rr.ScaledObjects {
			owners[so.Spec.ScaleTargetRef.Kind+"/"+so.Spec.ScaleTargetRef.Name] = "KEDA ScaledObject " + so.Metadata.Name
		}
		for _, w := range rr.Workloads {
			if owner, ok := owners[w.Kind+"/"+w.Name]; ok && w.Replicas != nil {
				t.Errorf("%s %s sets replicas: %d, but %s owns its replica count", w.Kind, w.Name, *w.Replicas, owner)
			}
		}
	}

	// The sink: two replicas, one active and a standby.
	if sink := r.workload(t, "sink"); sink.Replicas == nil || *sink.Replicas != 2 {
		t.Errorf("sink replicas = %v, want 2 (one active relay, one standby)", sink.Replicas)
	}

	// The processor: a StatefulSet whose pod name is the static member id,
	// scaled by KEDA on its group's lag up to the raw topic's partitions.
	proc := r.workload(t, "processor")
	if proc.Kind != "StatefulSet" {
		t.Errorf("processor is a %s, want a StatefulSet (stable pod names as --instance-id)", proc.Kind)
	}
	procEnv, err := r.env(proc.Pod.Spec.Containers[0], "paystream-processor-0")
	if err != nil {
		t.Fatal(err)
	}
	if procEnv["PAYSTREAM_INSTANCE_ID"] != "paystream-processor-0" {
		t.Errorf("processor PAYSTREAM_INSTANCE_ID = %q, want the pod name", procEnv["PAYSTREAM_INSTANCE_ID"])
	}
	migrate := r.workload(t, "migrate")
	migrateEnv, err := r.env(migrate.Pod.Spec.Containers[0], "paystream-migrate")
	if err != nil {
		t.Fatal(err)
	}
	partitions, err := strconv.Atoi(migrateEnv["PAYSTREAM_PARTITIONS"])
	if err != nil {
		t.Errorf("migrate must set PAYSTREAM_PARTITIONS explicitly (KEDA's bound follows it): %v", err)
	}
	if len(r.ScaledObjects) != 1 {
		t.Fatalf("%d ScaledObjects, want 1", len(r.ScaledObjects))
	}
	so := r.ScaledObjects[0]
	if so.Spec.ScaleTargetRef.Kind != proc.Kind || so.Spec.ScaleTargetRef.Name != proc.Name {
		t.Errorf("ScaledObject scales %s/%s, want %s/%s", so.Spec.ScaleTargetRef.Kind, so.Spec.ScaleTargetRef.Name, proc.Kind, proc.Name)
	}
	if int(so.Spec.MaxReplicaCount) != partitions {
		t.Errorf("ScaledObject maxReplicaCount = %d, want the raw topic's partitions %d: more replicas would idle", so.Spec.MaxReplicaCount, partitions)
	}
	if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "kafka" {
		t.Fatalf("ScaledObject triggers = %+v, want one kafka trigger", so.Spec.Triggers)
	}
	md := so.Spec.Triggers[0].Metadata
	if want := procEnv["PAYSTREAM_GROUP"]; want == "" || md["consumerGroup"] != want {
		t.Errorf("KEDA consumerGroup %q, processor PAYSTREAM_GROUP %q: want both set and equal", md["consumerGroup"], want)
	}
	rawTopic := envelope.TopicRaw
	if v, ok := procEnv["PAYSTREAM_RAW_TOPIC"]; ok {
		rawTopic = v
	}
	if md["topic"] != rawTopic {
		t.Errorf("KEDA topic %q, want the processor's raw topic %q", md["topic"], rawTopic)
	}
	if name := md["bootstrapServersFromEnv"]; procEnv[name] == "" {
		t.Errorf("KEDA bootstrapServersFromEnv %q is not set in the processor container", name)
	}
	if md["allowIdleConsumers"] == "true" {
		t.Errorf("KEDA allowIdleConsumers true: replicas beyond the partitions would idle")
	}

	// Network policies open only ports the selected containers declare.
	for _, np := range r.NetworkPolicies {
		for _, w := range r.Workloads {
			if !selects(np.Spec.PodSelector.MatchLabels, w.Pod.Labels) {
				continue
			}
			for _, rule := range np.Spec.Ingress {
				for _, p := range rule.Ports {
					if p.Port == nil {
						continue
					}
					if _, ok := containerPort(w.Pod.Spec.Containers[0], p.Port.String()); !ok && w.Kind != "Job" {
						t.Errorf("NetworkPolicy %s opens port %s, which %s does not declare", np.Name, p.Port.String(), w.Name)
					}
				}
			}
		}
	}
}

// jobName matches a name the Job controller accepts: a DNS subdomain
// that is also a label value (job-name), so at most 63 characters.
var jobName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$`)

// TestMigrateJobPerVersion: the example overlay names the migrate Job after
// the image's tag, so that applying a new version creates a new Job (a
// Job's template cannot be changed) and migrate runs on every rollout;
// rendering the overlay with another tag gives another Job, whose image is
// that tag (also from a registry with a port).
func TestMigrateJobPerVersion(t *testing.T) {
	t.Parallel()
	names := map[string]string{}
	for _, c := range []struct{ registry, tag string }{
		{"registry.example.com", "1.0.0"}, {"registry.example.com", "1.0.1"}, {"registry.example.com:5000/team", "2.0.0-rc.1"},
	} {
		tag := c.tag
		r := render(t, overlayWithImage(t, c.registry+"/paystream", tag))
		w := r.workload(t, "migrate")
		if w.Kind != "Job" {
			t.Fatalf("migrate runs as a %s, want a Job", w.Kind)
		}
		want := "paystream-migrate-" + tag
		if w.Name != want || !jobName.MatchString(w.Name) {
			t.Errorf("tag %s: migrate Job %q, want %q (a valid Job name)", tag, w.Name, want)
		}
		if img := w.Pod.Spec.Containers[0].Image; img != c.registry+"/paystream:"+tag {
			t.Errorf("tag %s: migrate Job %s runs %s", tag, w.Name, img)
		}
		if prev, ok := names[w.Name]; ok {
			t.Errorf("tags %s and %s both name the migrate Job %s: applying the second fails (the template is immutable)", prev, tag, w.Name)
		}
		names[w.Name] = tag
	}
	t.Logf("migrate Jobs by tag: %v", names)
}

// overlayWithImage copies deploy/k8s into a temporary directory with the
// example overlay's image set to name:tag, and returns that overlay's path.
func overlayWithImage(t *testing.T, name, tag string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir("k8s", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if path == filepath.Join(exampleDir, "kustomization.yaml") {
			re := regexp.MustCompile(`(?m)^    newName: registry\.example\.com/paystream\n    newTag: "1\.0\.0"$`)
			if !re.Match(b) {
				return fmt.Errorf("%s: no image registry.example.com/paystream:1.0.0 to replace", path)
			}
			b = re.ReplaceAll(b, fmt.Appendf(nil, "    newName: %s\n    newTag: %q", name, tag))
		}
		out := filepath.Join(dst, path)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dst, exampleDir)
}
