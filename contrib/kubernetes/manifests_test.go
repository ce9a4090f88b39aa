package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	csinode "github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/csipool"
)

// driverName is the CSI driver's name, which every manifest must spell alike.
const driverName = "csi.iser-blk.io"

// newObject is the API type of apiVersion and kind: only the kinds the manifests may hold.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 PersistentVolume":
		return &corev1.PersistentVolume{}, nil
	case "v1 PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	case "v1 Pod":
		return &corev1.Pod{}, nil
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "storage.k8s.io/v1 CSIDriver":
		return &storagev1.CSIDriver{}, nil
	case "storage.k8s.io/v1 StorageClass":
		return &storagev1.StorageClass{}, nil
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return &rbacv1.ClusterRole{}, nil
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, nil
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	}
	return nil, fmt.Errorf("apiVersion %q kind %q is not a kind these manifests hold", apiVersion, kind)
}

// documents splits a multi-document YAML file at its `---` lines, dropping documents that hold
// only comments and blank lines.
func documents(data []byte) [][]byte {
	var docs [][]byte
	var cur []string
	flush := func() {
		for _, l := range cur {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
				docs = append(docs, []byte(strings.Join(cur, "\n")))
				break
			}
		}
		cur = nil
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.TrimRight(l, " \t") == "---" {
			flush()
			continue
		}
		cur = append(cur, l)
	}
	flush()
	return docs
}

// decodeStrict decodes one document into its API type: duplicate keys and fields the type does
// not have are errors (sigs.k8s.io/yaml.UnmarshalStrict). encoding/json matches field names
// without regard to case, so a key spelt in another case (hostnetwork) would pass that; the
// round trip below catches it: every key with a non-empty value must come back as written.
func decodeStrict(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	obj, err := newObject(tm.APIVersion, tm.Kind)
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	var written any
	if err := yaml.Unmarshal(doc, &written); err != nil {
		return nil, err
	}
	back, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var decoded any
	if err := json.Unmarshal(back, &decoded); err != nil {
		return nil, err
	}
	if err := sameKeys(written, decoded, tm.Kind); err != nil {
		return nil, err
	}
	return obj, nil
}

// sameKeys reports the first key of written with a non-empty value that decoded lacks.
func sameKeys(written, decoded any, at string) error {
	switch w := written.(type) {
	case map[string]any:
		d, _ := decoded.(map[string]any)
		for k, v := range w {
			if empty(v) {
				continue // omitempty fields do not come back
			}
			dv, ok := d[k]
			if !ok {
				return fmt.Errorf("%s.%s: no such field (is its case right?)", at, k)
			}
			if err := sameKeys(v, dv, at+"."+k); err != nil {
				return err
			}
		}
	case []any:
		d, _ := decoded.([]any)
		for i, v := range w {
			if i < len(d) {
				if err := sameKeys(v, d[i], fmt.Sprintf("%s[%d]", at, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func empty(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Map, reflect.Slice, reflect.String:
		return rv.Len() == 0
	}
	return rv.IsZero()
}

// manifests decodes every *.yaml file of this directory.
func manifests(t *testing.T) map[string][]any {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	all := map[string][]any{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs := documents(data)
		if len(docs) == 0 {
			t.Errorf("%s: no documents", f)
		}
		for i, doc := range docs {
			obj, err := decodeStrict(doc)
			if err != nil {
				t.Errorf("%s, document %d: %v", f, i+1, err)
				continue
			}
			all[f] = append(all[f], obj)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return all
}

// only returns the one object of type T among the manifests.
func only[T any](t *testing.T, all map[string][]any) T {
	t.Helper()
	var found []T
	for _, objs := range all {
		for _, o := range objs {
			if v, ok := o.(T); ok {
				found = append(found, v)
			}
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%d objects of type %T, want 1", len(found), zero)
	}
	return found[0]
}

func TestManifestsDecodeStrictly(t *testing.T) {
	all := manifests(t)
	n := 0
	for _, objs := range all {
		n += len(objs)
	}
	// namespace 1, csidriver 1, rbac 6, node 1, controller 1, pool 1, storageclass 1, pvc 2, static 3
	if n != 17 {
		t.Fatalf("%d objects decoded, want 17 (a document lost in splitting?)", n)
	}
}

func TestStrictDecodingCatchesTypos(t *testing.T) {
	const ds = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      %s: true\n"
	if _, err := decodeStrict(fmt.Appendf(nil, ds, "hostNetwork")); err != nil {
		t.Fatalf("the correct field: %v", err)
	}
	for _, bad := range [][]byte{
		fmt.Appendf(nil, ds, "hostNetwrok"),
		fmt.Appendf(nil, ds, "hostnetwork"),
		[]byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  name: y\n"),
		[]byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  containers:\n    - name: c\n      imagePullPolicy: IfNotPresent\n      args: [a]\n      command: {}\n"),
		[]byte("apiVersion: storage.k8s.io/v1beta1\nkind: CSIDriver\nmetadata:\n  name: x\n"),
		[]byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n"),
	} {
		if _, err := decodeStrict(bad); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
	if got := len(documents([]byte("# only\n---\n\n---\napiVersion: v1\n--- \nkind: x\n"))); got != 2 {
		t.Errorf("%d documents, want 2", got)
	}
}

// container returns the named container of a pod spec.
func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

func hostPaths(spec corev1.PodSpec) map[string]string {
	m := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			m[v.Name] = v.HostPath.Path
		}
	}
	return m
}

func mountOf(c corev1.Container, volume string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == volume {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func nodeNameEnv(t *testing.T, c corev1.Container) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			return
		}
	}
	t.Errorf("container %s: no NODE_NAME from spec.nodeName for $(NODE_NAME)", c.Name)
}

// csiAddressOf checks that every sidecar of spec reaches the plugin's socket: --csi-address in
// the volume the plugin serves its endpoint in.
func csiAddressOf(t *testing.T, spec corev1.PodSpec, plugin corev1.Container, sidecars ...string) {
	t.Helper()
	sock := mountOf(plugin, "plugin-dir")
	if sock == nil {
		sock = mountOf(plugin, "socket-dir")
	}
	if sock == nil || !slices.Contains(plugin.Args, "unix://"+path.Join(sock.MountPath, "csi.sock")) {
		t.Fatalf("the plugin's endpoint is not in its socket volume: %v", plugin.Args)
	}
	for _, name := range sidecars {
		c := container(t, spec, name)
		m := mountOf(c, sock.Name)
		if m == nil || !slices.Contains(c.Args, "--csi-address="+path.Join(m.MountPath, "csi.sock")) {
			t.Errorf("%s does not reach the plugin's socket: %v", name, c.Args)
		}
	}
}

func TestNodePlugin(t *testing.T) {
	ds := only[*appsv1.DaemonSet](t, manifests(t))
	spec := ds.Spec.Template.Spec
	plugin := container(t, spec, "iser-blk")
	if want := []string{"csi", "--endpoint", "unix:///csi/csi.sock", "--node-id", "$(NODE_NAME)", "--launcher", "systemd-scope",
		"--cache-dev-dir", "/var/lib/iser-blk/cache-dev"}; !slices.Equal(plugin.Args, want) {
		t.Errorf("node plugin args %q, want %q", plugin.Args, want)
	}
	// The gateways run on the host (systemd scopes) and open the cache device by the path the
	// plugin gives: the directory must be a hostPath mounted at its own path.
	sameOnHost := false
	for name, hp := range hostPaths(spec) {
		if m := mountOf(plugin, name); m != nil && m.MountPath == hp && strings.HasPrefix("/var/lib/iser-blk/cache-dev", hp+"/") {
			sameOnHost = true
		}
	}
	if !sameOnHost {
		t.Error("--cache-dev-dir is not on a hostPath mounted at the same path in the plugin")
	}
	nodeNameEnv(t, plugin)
	if plugin.SecurityContext == nil || plugin.SecurityContext.Privileged == nil || !*plugin.SecurityContext.Privileged {
		t.Error("the node plugin is not privileged")
	}
	if !spec.HostNetwork {
		t.Error("the node plugin is not on the host network (storage network, RDMA devices)")
	}
	hp := hostPaths(spec)
	for vol, want := range map[string]string{
		"kubelet-dir": "/var/lib/kubelet", "dev": "/dev", "sys": "/sys", "lib-modules": "/lib/modules",
		"run-dir": "/run/iser-blk", "state-dir": "/var/lib/iser-blk", "etc-iser-blk": "/etc/iser-blk",
		"plugin-dir": "/var/lib/kubelet/plugins/" + driverName, "registration-dir": "/var/lib/kubelet/plugins_registry",
		"host-systemd": "/run/systemd", // the gateways' scopes (--launcher systemd-scope)
	} {
		if hp[vol] != want {
			t.Errorf("volume %s is host path %q, want %q", vol, hp[vol], want)
		}
		if vol == "registration-dir" {
			continue
		}
		if m := mountOf(plugin, vol); m == nil {
			t.Errorf("the node plugin does not mount %s", vol)
		} else if vol != "plugin-dir" && m.MountPath != want {
			t.Errorf("%s is mounted at %s, want the host's path %s", vol, m.MountPath, want)
		}
	}
	if m := mountOf(plugin, "kubelet-dir"); m == nil || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Error("the kubelet directory is not mounted with Bidirectional propagation: kubelet would not see the plugin's mounts")
	}
	registrar := container(t, spec, "node-driver-registrar")
	if !slices.Contains(registrar.Args, "--kubelet-registration-path="+hp["plugin-dir"]+"/csi.sock") {
		t.Errorf("the registrar tells kubelet another socket than the plugin's: %v", registrar.Args)
	}
	csiAddressOf(t, spec, plugin, "node-driver-registrar", "liveness-probe")
	probe := container(t, spec, "liveness-probe")
	if plugin.LivenessProbe == nil || plugin.LivenessProbe.HTTPGet == nil ||
		!slices.Contains(probe.Args, fmt.Sprintf("--http-endpoint=:%d", plugin.Ports[0].ContainerPort)) {
		t.Error("the plugin's liveness probe does not ask the livenessprobe sidecar")
	}
}

func TestController(t *testing.T) {
	all := manifests(t)
	dep := only[*appsv1.Deployment](t, all)
	spec := dep.Spec.Template.Spec
	plugin := container(t, spec, "iser-blk")
	want := []string{"csi", "--endpoint", "unix:///csi/csi.sock", "--node-id", "$(NODE_NAME)", "--pool", "/etc/iser-blk-csi/pool"}
	if !slices.Equal(plugin.Args, want) {
		t.Errorf("controller args %q, want %q", plugin.Args, want)
	}
	nodeNameEnv(t, plugin)
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Error("the controller must be one replica replaced with Recreate: one process holds the claims file")
	}
	provisioner := container(t, spec, "csi-provisioner")
	if !slices.Contains(provisioner.Args, "--leader-election") {
		t.Error("csi-provisioner without --leader-election")
	}
	csiAddressOf(t, spec, plugin, "csi-provisioner", "liveness-probe")
	// The pool file is the ConfigMap's key, where --pool reads it, and it parses.
	m := mountOf(plugin, "pool")
	var cmName, item string
	for _, v := range spec.Volumes {
		if v.Name == "pool" && v.ConfigMap != nil && len(v.ConfigMap.Items) == 1 {
			cmName, item = v.ConfigMap.Name, v.ConfigMap.Items[0].Path
		}
	}
	if m == nil || path.Join(m.MountPath, item) != "/etc/iser-blk-csi/pool" {
		t.Fatalf("--pool is not where the ConfigMap is mounted (%v, item %q)", m, item)
	}
	cm := only[*corev1.ConfigMap](t, all)
	if cm.Name != cmName {
		t.Fatalf("the controller mounts ConfigMap %q, the manifests define %q", cmName, cm.Name)
	}
	luns, err := csipool.ParsePool([]byte(cm.Data[item]))
	if err != nil || len(luns) != 3 {
		t.Fatalf("the example pool: %d LUNs, %v", len(luns), err)
	}
	claims := mountOf(plugin, "claims")
	if claims == nil || claims.MountPath != path.Dir(csipool.DefaultClaimsFile) || hostPaths(spec)["claims"] == "" {
		t.Errorf("the claims file's directory %s is not on a host path", path.Dir(csipool.DefaultClaimsFile))
	}
}

func TestDriverNameAndVolumeAttributes(t *testing.T) {
	all := manifests(t)
	if d := only[*storagev1.CSIDriver](t, all); d.Name != driverName || d.Spec.AttachRequired == nil || *d.Spec.AttachRequired {
		t.Errorf("CSIDriver %q, attachRequired %v: want %s without an attach step", d.Name, d.Spec.AttachRequired, driverName)
	}
	sc := only[*storagev1.StorageClass](t, all)
	if sc.Provisioner != driverName {
		t.Errorf("StorageClass provisioner %q", sc.Provisioner)
	}
	if _, err := csipool.ParseParameters(sc.Parameters); err != nil {
		t.Errorf("StorageClass parameters: %v", err)
	}
	pv := only[*corev1.PersistentVolume](t, all)
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driverName {
		t.Fatalf("the static PV is not the driver's: %+v", pv.Spec.CSI)
	}
	if _, err := csinode.ParseVolumeContext(pv.Spec.CSI.VolumeAttributes); err != nil {
		t.Errorf("the node plugin refuses the static PV's volumeAttributes: %v", err)
	}
	if _, err := csipool.ParseVolumeContext(pv.Spec.CSI.VolumeAttributes); err != nil {
		t.Errorf("the static PV's volumeAttributes: %v", err)
	}
	if strings.HasPrefix(pv.Spec.CSI.VolumeHandle, "pool-") {
		t.Error("a static volume handle must not look like a pool volume's ID")
	}
	secret := only[*corev1.Secret](t, all)
	ref := pv.Spec.CSI.NodeStageSecretRef
	if ref == nil || ref.Name != secret.Name || ref.Namespace != secret.Namespace ||
		sc.Parameters["csi.storage.k8s.io/node-stage-secret-name"] != secret.Name {
		t.Error("the CHAP secret the PV and the StorageClass name is not the one defined")
	}
}

func TestContainerfile(t *testing.T) {
	data, err := os.ReadFile("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	from := regexp.MustCompile(`(?m)^FROM (\S+)\s*$`).FindAllStringSubmatch(text, -1)
	if len(from) == 0 || from[len(from)-1][1] != "docker.io/library/debian:12-slim" {
		t.Errorf("the image is not based on Debian 12 slim: %v", from)
	}
	for _, pkg := range []string{"e2fsprogs", "xfsprogs", "util-linux", "mount", "kmod", "libibverbs1", "librdmacm1"} {
		if !regexp.MustCompile(`\s` + regexp.QuoteMeta(pkg) + `\s`).MatchString(text) {
			t.Errorf("the image does not install %s", pkg)
		}
	}
	if !bytes.Contains(data, []byte("CGO_ENABLED=1")) {
		t.Error("the image's binary is not the rdma (cgo) build")
	}
}
