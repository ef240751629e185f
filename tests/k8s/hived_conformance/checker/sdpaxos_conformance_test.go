// The HiveD side of sdpaxos's conformance fixtures (tests/k8s/hived_conformance).
//
// This file is sdpaxos's own code. It is not part of HiveD: generate.py copies it into a
// fetched microsoft/hivedscheduler checkout, as pkg/scheduler/sdpaxos_conformance_test.go,
// so that it builds against HiveD's packages and vendored dependencies and can drive
// HiveD's real scheduler (its informer callbacks, its web server's routes, its algorithm)
// without a Kubernetes cluster: the API server is client-go's fake clientset.
//
// It writes one JSON document (to $SDPAXOS_OUT):
//   - "schemas": HiveD's Go types of every object the extender answers or writes (the
//     extender API results of kube-scheduler 1.15 that HiveD vendors, the inspect API's
//     objects, PodBindInfo and PodSchedulingSpec), as encoding/json (or yaml.v2) sees them;
//   - "specCases": pod scheduling spec annotations and what HiveD's filter answers for each
//     (its ExtractPodSchedulingSpec result, or the error text it answers);
//   - "scenarios": every pod of HiveD's example/ run through filter, preempt, bind and the
//     inspect paths, each request's body and HiveD's status and answer;
//   - "errors": the error answers of the extender and inspect paths.
package scheduler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/ioutil"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/microsoft/hivedscheduler/pkg/algorithm"
	si "github.com/microsoft/hivedscheduler/pkg/api"
	"github.com/microsoft/hivedscheduler/pkg/internal"
	"github.com/microsoft/hivedscheduler/pkg/webserver"
	yaml "gopkg.in/yaml.v2"
	core "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	meta "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeInformer "k8s.io/client-go/informers"
	kubeClient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ei "k8s.io/kubernetes/pkg/scheduler/api"
)

// ---------------------------------------------------------------------------- schemas

var timeType = reflect.TypeOf(meta.Time{})

// typeName is how the schema names a Go type: its import path (outside the vendor
// directory) and name.
func typeName(t reflect.Type) string {
	path := t.PkgPath()
	if cut := strings.LastIndex(path, "/vendor/"); cut >= 0 {
		path = path[cut+len("/vendor/"):]
	}
	return path + "." + t.Name()
}

// opaque: Kubernetes core objects the extender passes through (a pod, a node list).
func opaque(t reflect.Type) bool {
	return strings.HasPrefix(typeName(t), "k8s.io/api/")
}

type schemaWriter struct {
	tag  string // "json" or "yaml"
	defs map[string]interface{}
}

func (w *schemaWriter) of(t reflect.Type) map[string]interface{} {
	if t == timeType {
		return map[string]interface{}{"kind": "time"}
	}
	switch t.Kind() {
	case reflect.Ptr:
		return map[string]interface{}{"kind": "ptr", "elem": w.of(t.Elem())}
	case reflect.Slice:
		return map[string]interface{}{"kind": "slice", "elem": w.of(t.Elem())}
	case reflect.Map:
		return map[string]interface{}{"kind": "map", "key": w.of(t.Key()), "elem": w.of(t.Elem())}
	case reflect.String:
		return map[string]interface{}{"kind": "string"}
	case reflect.Bool:
		return map[string]interface{}{"kind": "bool"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]interface{}{"kind": "int", "bits": t.Bits()}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]interface{}{"kind": "uint", "bits": t.Bits()}
	case reflect.Float32, reflect.Float64:
		return map[string]interface{}{"kind": "float"}
	case reflect.Interface:
		return map[string]interface{}{"kind": "any"}
	case reflect.Struct:
		name := typeName(t)
		if opaque(t) {
			return map[string]interface{}{"kind": "opaque", "name": name}
		}
		if _, done := w.defs[name]; !done {
			w.defs[name] = nil // recursion guard
			w.defs[name] = map[string]interface{}{"kind": "struct", "fields": w.fields(t)}
		}
		return map[string]interface{}{"kind": "ref", "name": name}
	}
	panic(fmt.Sprintf("no schema for %v", t))
}

// fields: a struct's fields as the decoder sees them (embedded structs flattened).
func (w *schemaWriter) fields(t reflect.Type) []interface{} {
	out := []interface{}{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get(w.tag)
		name, options := tag, ""
		if comma := strings.Index(tag, ","); comma >= 0 {
			name, options = tag[:comma], tag[comma+1:]
		}
		if name == "-" || (f.PkgPath != "" && !f.Anonymous) {
			continue
		}
		inline := strings.Contains(options, "inline")
		if f.Anonymous && f.Type.Kind() == reflect.Struct && (name == "" && w.tag == "json" || inline) {
			out = append(out, w.fields(f.Type)...)
			continue
		}
		if name == "" {
			name = f.Name
			if w.tag == "yaml" {
				name = strings.ToLower(f.Name)
			}
		}
		out = append(out, map[string]interface{}{
			"name":      name,
			"go":        f.Name,
			"omitempty": strings.Contains(options, "omitempty"),
			"type":      w.of(f.Type),
		})
	}
	return out
}

func schemas() map[string]interface{} {
	j := &schemaWriter{tag: "json", defs: map[string]interface{}{}}
	roots := map[string]interface{}{}
	for name, v := range map[string]interface{}{
		"ExtenderArgs":             ei.ExtenderArgs{},
		"ExtenderFilterResult":     ei.ExtenderFilterResult{},
		"ExtenderPreemptionArgs":   ei.ExtenderPreemptionArgs{},
		"ExtenderPreemptionResult": ei.ExtenderPreemptionResult{},
		"ExtenderBindingArgs":      ei.ExtenderBindingArgs{},
		"ExtenderBindingResult":    ei.ExtenderBindingResult{},
		"WebServerPaths":           si.WebServerPaths{},
		"AffinityGroupList":        si.AffinityGroupList{},
		"AffinityGroup":            si.AffinityGroup{},
		"ClusterStatus":            si.ClusterStatus{},
		"PhysicalClusterStatus":    si.PhysicalClusterStatus{},
		"VirtualClusterStatus":     si.VirtualClusterStatus{},
		"VirtualClustersStatus":    map[si.VirtualClusterName]si.VirtualClusterStatus{},
	} {
		roots[name] = j.of(reflect.TypeOf(v))
	}
	y := &schemaWriter{tag: "yaml", defs: map[string]interface{}{}}
	yamlRoots := map[string]interface{}{
		"PodBindInfo":       y.of(reflect.TypeOf(si.PodBindInfo{})),
		"PodSchedulingSpec": y.of(reflect.TypeOf(si.PodSchedulingSpec{})),
	}
	return map[string]interface{}{
		"json": map[string]interface{}{"roots": roots, "defs": j.defs},
		"yaml": map[string]interface{}{"roots": yamlRoots, "defs": y.defs},
	}
}

// ---------------------------------------------------------------------------- HiveD in a box

// box is HiveD's scheduler with a fake API server (one that only takes Bindings), driven as
// its informers and kube-scheduler would drive it; every HTTP call goes through HiveD's own
// web server.
type box struct {
	s        *HivedScheduler
	api      *httptest.Server
	mux      *http.ServeMux
	pods     map[string]*core.Pod // by name: the pods the API server has
	bindings map[string]map[string]string
	steps    []interface{}
}

var muxLock sync.Mutex

func newBox(configPath string) *box {
	sConfig := si.NewConfig(si.InitRawConfig(&configPath))
	b := &box{pods: map[string]*core.Pod{}, bindings: map[string]map[string]string{}}
	b.api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		binding := core.Binding{}
		if r.Method != "POST" || !strings.HasSuffix(r.URL.Path, "/binding") ||
			json.NewDecoder(r.Body).Decode(&binding) != nil {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		b.bindings[binding.Name] = binding.Annotations
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Success"}`))
	}))
	client := kubeClient.NewForConfigOrDie(&rest.Config{Host: b.api.URL})
	factory := kubeInformer.NewSharedInformerFactory(client, 0)
	nodes := factory.Core().V1().Nodes()
	podsInformer := factory.Core().V1().Pods()
	s := &HivedScheduler{
		sConfig:             sConfig,
		kClient:             client,
		nodeInformer:        nodes.Informer(),
		podInformer:         podsInformer.Informer(),
		nodeLister:          nodes.Lister(),
		podLister:           podsInformer.Lister(),
		schedulerLock:       &sync.RWMutex{},
		podScheduleStatuses: internal.PodScheduleStatuses{},
		schedulerAlgorithm:  algorithm.NewHivedAlgorithm(sConfig),
	}
	// HiveD registers its routes on http.DefaultServeMux: one box per process at a time.
	muxLock.Lock()
	http.DefaultServeMux = http.NewServeMux()
	s.webServer = webserver.NewWebServer(sConfig,
		internal.ExtenderHandlers{
			FilterHandler:  s.filterRoutine,
			BindHandler:    s.bindRoutine,
			PreemptHandler: s.preemptRoutine,
		},
		internal.InspectHandlers{
			GetAllAffinityGroupsHandler:        s.getAllAffinityGroups,
			GetAffinityGroupHandler:            s.getAffinityGroup,
			GetClusterStatusHandler:            s.getClusterStatus,
			GetPhysicalClusterStatusHandler:    s.getPhysicalClusterStatus,
			GetAllVirtualClustersStatusHandler: s.getAllVirtualClustersStatus,
			GetVirtualClusterStatusHandler:     s.getVirtualClusterStatus,
		})
	b.mux = http.DefaultServeMux
	muxLock.Unlock()
	b.s = s
	for _, name := range configNodes(sConfig) {
		node := &core.Node{
			ObjectMeta: meta.ObjectMeta{Name: name, UID: types.UID("node-" + name)},
			Status: core.NodeStatus{Conditions: []core.NodeCondition{
				{Type: core.NodeReady, Status: core.ConditionTrue}}},
		}
		s.nodeInformer.GetIndexer().Add(node)
		s.addNode(node)
	}
	return b
}

// configNodes: the K8s node names of a config, in the order its cells list them.
func configNodes(c *si.Config) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, slot := range configNodeSlots(c) {
		if !seen[slot.Node] {
			seen[slot.Node] = true
			out = append(out, slot.Node)
		}
	}
	return out
}

// nodeSlots: one (node, leaf type, leaf count) per node-level cell of the config.
type nodeSlot struct {
	Node, LeafType string
	Leaves         int32
}

func configNodeSlots(c *si.Config) []nodeSlot {
	out := []nodeSlot{}
	var walk func(spec si.PhysicalCellSpec, ct si.CellType)
	walk = func(spec si.PhysicalCellSpec, ct si.CellType) {
		t, ok := c.PhysicalCluster.CellTypes[ct]
		if !ok {
			return
		}
		if t.IsNodeLevel {
			parts := strings.Split(string(spec.CellAddress), "/")
			leaves, leaf := int32(1), ct
			for {
				lt, ok := c.PhysicalCluster.CellTypes[leaf]
				if !ok {
					break
				}
				leaves *= lt.ChildCellNumber
				leaf = lt.ChildCellType
			}
			out = append(out, nodeSlot{parts[len(parts)-1], string(leaf), leaves})
			return
		}
		for _, child := range spec.CellChildren {
			walk(child, t.ChildCellType)
		}
	}
	for _, spec := range c.PhysicalCluster.PhysicalCells {
		walk(spec, spec.CellType)
	}
	return out
}

func (b *box) nodes() []string { return configNodes(b.s.sConfig) }

type answer struct {
	Status int
	Body   []byte
}

func (b *box) http(method, path string, body []byte) answer {
	request := httptest.NewRequest(method, path, bytes.NewReader(body))
	recorder := httptest.NewRecorder()
	b.mux.ServeHTTP(recorder, request)
	return answer{recorder.Code, recorder.Body.Bytes()}
}

func raw(data []byte) json.RawMessage {
	if len(bytes.TrimSpace(data)) == 0 {
		return json.RawMessage("null")
	}
	if !json.Valid(data) {
		quoted, _ := json.Marshal(string(data))
		return quoted
	}
	return json.RawMessage(bytes.TrimSpace(data))
}

// call makes one request and records it as a step.
func (b *box) call(step string, method, path string, body []byte, extra map[string]interface{}) answer {
	a := b.http(method, path, body)
	record := map[string]interface{}{
		"step": step, "method": method, "path": path,
		"status": a.Status, "response": raw(a.Body),
	}
	if body != nil {
		record["body"] = raw(body)
	}
	for k, v := range extra {
		record[k] = v
	}
	b.steps = append(b.steps, record)
	return a
}

func mustJSON(v interface{}) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}

// ---------------------------------------------------------------------------- pods

func hivedPod(namespace, name, spec string) *core.Pod {
	return &core.Pod{
		TypeMeta: meta.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: meta.ObjectMeta{
			Namespace: namespace, Name: name, UID: types.UID("uid-" + name),
			Annotations: map[string]string{si.AnnotationKeyPodSchedulingSpec: spec},
		},
		Spec: core.PodSpec{
			SchedulerName: "hivedscheduler",
			Containers: []core.Container{{
				Name: "main", Image: "ubuntu:trusty",
				Resources: core.ResourceRequirements{Limits: core.ResourceList{
					si.ResourceNamePodSchedulingEnable: resource.MustParse("1")}},
			}},
		},
		Status: core.PodStatus{Phase: core.PodPending},
	}
}

// examplePods: the pods FrameworkController makes of the Frameworks of an example request
// file ({framework}-{taskrole}-{index}), with their templates' annotations.
func examplePods(path string) []*core.Pod {
	data, err := ioutil.ReadFile(path)
	if err != nil {
		panic(err)
	}
	out := []*core.Pod{}
	for _, doc := range strings.Split(string(data), "\n---") {
		var framework struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Spec struct {
				TaskRoles []struct {
					Name       string `yaml:"name"`
					TaskNumber int    `yaml:"taskNumber"`
					Task       struct {
						Pod struct {
							Metadata struct {
								Annotations map[string]string `yaml:"annotations"`
							} `yaml:"metadata"`
						} `yaml:"pod"`
					} `yaml:"task"`
				} `yaml:"taskRoles"`
			} `yaml:"spec"`
		}
		if yaml.Unmarshal([]byte(doc), &framework) != nil || framework.Kind != "Framework" {
			continue
		}
		for _, role := range framework.Spec.TaskRoles {
			spec := role.Task.Pod.Metadata.Annotations[si.AnnotationKeyPodSchedulingSpec]
			for i := 0; i < role.TaskNumber; i++ {
				name := fmt.Sprintf("%v-%v-%v", framework.Metadata.Name, role.Name, i)
				out = append(out, hivedPod("default", name, spec))
			}
		}
	}
	return out
}

func (b *box) addPod(pod *core.Pod) {
	b.pods[pod.Name] = pod
	b.s.addPod(pod)
}

func (b *box) deletePod(name string) {
	pod := b.pods[name]
	delete(b.pods, name)
	b.s.deletePod(pod)
}

func (b *box) filter(step string, pod *core.Pod, nodes []string) ei.ExtenderFilterResult {
	body := mustJSON(ei.ExtenderArgs{Pod: pod, NodeNames: &nodes})
	a := b.call(step, "POST", si.FilterPath, body, map[string]interface{}{"pod": pod.Name})
	result := ei.ExtenderFilterResult{}
	json.Unmarshal(a.Body, &result)
	return result
}

func (b *box) preempt(step string, pod *core.Pod, nodes []string) (ei.ExtenderPreemptionResult, int) {
	candidates := map[string]*ei.MetaVictims{}
	for _, n := range nodes {
		candidates[n] = &ei.MetaVictims{Pods: []*ei.MetaPod{}}
	}
	body := mustJSON(ei.ExtenderPreemptionArgs{Pod: pod, NodeNameToMetaVictims: candidates})
	a := b.call(step, "POST", si.PreemptPath, body, map[string]interface{}{"pod": pod.Name})
	result := ei.ExtenderPreemptionResult{}
	json.Unmarshal(a.Body, &result)
	return result, a.Status
}

func (b *box) bind(step string, pod *core.Pod, node string) ei.ExtenderBindingResult {
	args := ei.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node}
	delete(b.bindings, pod.Name) // only this call's Binding counts
	a := b.http("POST", si.BindPath, mustJSON(args))
	result := ei.ExtenderBindingResult{}
	json.Unmarshal(a.Body, &result)
	record := map[string]interface{}{
		"step": step, "method": "POST", "path": si.BindPath, "pod": pod.Name,
		"body": raw(mustJSON(args)), "status": a.Status, "response": raw(a.Body),
	}
	if annotations, ok := b.bindings[pod.Name]; ok && result.Error == "" {
		record["annotations"] = annotations
		bound := pod.DeepCopy()
		bound.Spec.NodeName = node
		for k, v := range annotations {
			bound.Annotations[k] = v
		}
		b.pods[pod.Name] = bound
		b.s.updatePod(pod, bound) // the pod informer sees it bound
	}
	b.steps = append(b.steps, record)
	return result
}

// schedule runs one pod as kube-scheduler would: filter; while HiveD names preemptible
// pods, preempt and delete the victims; bind once filter names a node. The outcome.
func (b *box) schedule(pod *core.Pod) string {
	nodes := b.nodes()
	for round := 0; round < 8; round++ {
		result := b.filter("filter", pod, nodes)
		if result.Error != "" {
			return "error"
		}
		if result.NodeNames != nil && len(*result.NodeNames) == 1 {
			if b.bind("bind", pod, (*result.NodeNames)[0]).Error != "" {
				return "bind-error"
			}
			return "bound"
		}
		if _, waiting := result.FailedNodes[si.ComponentName]; waiting || len(result.FailedNodes) == 0 {
			return "waiting"
		}
		victims, status := b.preempt("preempt", pod, nodes)
		if status != http.StatusOK {
			return "preempt-error"
		}
		uids := map[string]bool{}
		for _, v := range victims.NodeNameToMetaVictims {
			for _, p := range v.Pods {
				uids[p.UID] = true
			}
		}
		names := []string{}
		for name, p := range b.pods {
			if uids[string(p.UID)] {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		for _, name := range names { // Kubernetes deletes the victims
			b.deletePod(name)
		}
		b.steps = append(b.steps, map[string]interface{}{"step": "deleted", "pods": names})
	}
	return "unfinished"
}

// fill places one opportunistic pod per node-level cell of the config (the whole node), so
// every guaranteed pod after it has to preempt.
func (b *box) fill() []string {
	names := []string{}
	for i, slot := range configNodeSlots(b.s.sConfig) {
		name := fmt.Sprintf("filler-%02d", i)
		spec := fmt.Sprintf("virtualCluster: VC1\npriority: -1\nleafCellType: %v\nleafCellNumber: %v\n",
			slot.LeafType, slot.Leaves)
		pod := hivedPod("fillers", name, spec)
		b.addPod(pod)
		if b.schedule(pod) == "bound" {
			names = append(names, name)
		}
	}
	return names
}

// inspectAll asks the inspect paths: the root, the groups and, as "trees" says, every cell
// tree ("all"), the whole cluster status only ("status") or none ("").
func (b *box) inspectAll(groups []string, trees string) {
	b.call("inspect", "GET", "/", nil, nil)
	b.call("inspect", "GET", si.AffinityGroupsPath, nil, nil)
	for _, g := range groups {
		b.call("inspect", "GET", si.AffinityGroupsPath+g, nil, map[string]interface{}{"group": g})
	}
	if trees != "" {
		b.call("inspect", "GET", si.ClusterStatusPath, nil, nil)
	}
	if trees != "all" {
		return
	}
	b.call("inspect", "GET", si.PhysicalClusterPath, nil, nil)
	b.call("inspect", "GET", si.VirtualClustersPath, nil, nil)
	vcs := []string{}
	for vc := range *b.s.sConfig.VirtualClusters {
		vcs = append(vcs, string(vc))
	}
	sort.Strings(vcs)
	for _, vc := range vcs {
		b.call("inspect", "GET", si.VirtualClustersPath+vc, nil, map[string]interface{}{"vc": vc})
	}
}

// ---------------------------------------------------------------------------- scenarios

type scenario struct {
	Name, Config, Requests string
	Jobs                   []string // framework names to run, in order
	Fill                   bool     // fill every node with opportunistic pods first
	Before                 bool     // record the cluster status before the jobs
	Trees                  string   // afterwards, which cell trees to inspect (inspectAll)
}

func runScenario(root string, sc scenario) map[string]interface{} {
	b := newBox(filepath.Join(root, sc.Config))
	fillers := []string{}
	if sc.Fill {
		fillers = b.fill()
	}
	if sc.Before {
		b.call("inspect", "GET", si.ClusterStatusPath, nil, map[string]interface{}{"when": "before"})
	}
	outcomes := map[string]string{}
	order := []string{}
	groups := map[string]bool{}
	for _, pod := range examplePods(filepath.Join(root, sc.Requests)) {
		keep := false
		for _, j := range sc.Jobs {
			keep = keep || strings.HasPrefix(pod.Name, j+"-")
		}
		if !keep {
			continue
		}
		b.addPod(pod)
		order = append(order, pod.Name)
		spec := internal.ExtractPodSchedulingSpec(pod)
		groups[spec.AffinityGroup.Name] = true
	}
	for _, name := range order {
		outcomes[name] = b.schedule(b.pods[name])
	}
	names := []string{}
	for g := range groups {
		names = append(names, g)
	}
	sort.Strings(names)
	b.inspectAll(names, sc.Trees)
	pods := []interface{}{}
	for _, name := range order {
		pods = append(pods, map[string]interface{}{"name": name, "outcome": outcomes[name]})
	}
	return map[string]interface{}{
		"name": sc.Name, "config": sc.Config, "requests": sc.Requests, "nodes": b.nodes(),
		"fillers": fillers, "pods": pods, "steps": b.steps,
	}
}

// ---------------------------------------------------------------------------- spec cases

type specCase struct {
	Name, Spec string
}

var specCases = []specCase{
	{"minimal", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\n"},
	{"typed", "virtualCluster: VC1\npriority: 1000\nleafCellType: K80\nleafCellNumber: 2\n"},
	{"legacy-keys", "virtualCluster: VC1\npriority: 1\ngpuType: K80\ngpuNumber: 2\n"},
	{"legacy-group", "virtualCluster: VC1\npriority: 1\ngpuType: K80\ngpuNumber: 2\naffinityGroup:\n  name: legacy\n  members:\n  - podNumber: 2\n    gpuNumber: 2\n"},
	{"version-v2-with-v1-fields", "version: v2\nvirtualCluster: VC1\npriority: 1\nleafCellNumber: 1\n"},
	{"v2-schema", "version: v2\nvirtualCluster: VC1\npriority: 1\ncellType: K80\ncellNumber: 1\npodRootGroup:\n  name: v2\n  pod:\n    podMinNumber: 1\n    podMaxNumber: 1\n    cellsPerPod: {cellType: K80, cellNumber: 1}\n    containsCurrentPod: true\n"},
	{"merged-members", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\naffinityGroup:\n  name: merged\n  members:\n  - {podNumber: 1, leafCellNumber: 1}\n  - {podNumber: 2, leafCellNumber: 1}\n  - {podNumber: 1, leafCellNumber: 2}\n"},
	{"opportunistic", "virtualCluster: VC2\npriority: -1\nleafCellNumber: 1\n"},
	{"unknown-keys", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\nsomethingElse: 3\ngangReleaseEnable: true\n"},
	{"ignore-suggested-false", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\nignoreK8sSuggestedNodes: false\nlazyPreemptionEnable: true\n"},
	{"no-annotation", ""},
	{"no-vc", "priority: 1\nleafCellNumber: 1\n"},
	{"priority-low", "virtualCluster: VC1\npriority: -2\nleafCellNumber: 1\n"},
	{"priority-high", "virtualCluster: VC1\npriority: 1001\nleafCellNumber: 1\n"},
	{"no-leaf-number", "virtualCluster: VC1\npriority: 1\n"},
	{"null-leaf-number", "virtualCluster: VC1\npriority: 1\nleafCellNumber: null\n"},
	{"zero-leaf-number", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 0\n"},
	{"group-no-name", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\naffinityGroup:\n  members:\n  - {podNumber: 1, leafCellNumber: 1}\n"},
	{"member-zero-pods", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\naffinityGroup:\n  name: g\n  members:\n  - {podNumber: 0, leafCellNumber: 1}\n"},
	{"member-zero-leaves", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\naffinityGroup:\n  name: g\n  members:\n  - {podNumber: 1, leafCellNumber: 0}\n"},
	{"pod-not-in-group", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\naffinityGroup:\n  name: g\n  members:\n  - {podNumber: 1, leafCellNumber: 2}\n"},
	{"priority-not-int", "virtualCluster: VC1\npriority: high\nleafCellNumber: 1\n"},
	{"leaf-number-float", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1.5\n"},
	{"not-yaml", "virtualCluster: [VC1\n"},
	{"not-a-mapping", "- virtualCluster: VC1\n"},
	{"unknown-vc", "virtualCluster: nope\npriority: 1\nleafCellNumber: 1\n"},
	{"unknown-leaf-type", "virtualCluster: VC1\npriority: 1\nleafCellType: P100\nleafCellNumber: 1\n"},
	{"unknown-pinned", "virtualCluster: VC1\npriority: 1\npinnedCellId: VC2-K80\nleafCellNumber: 1\n"},
	{"opportunistic-pinned", "virtualCluster: VC2\npriority: -1\npinnedCellId: VC2-K80\nleafCellNumber: 1\n"},
}

func runSpecCases(root string) []interface{} {
	b := newBox(filepath.Join(root, "example/config/basic/hivedscheduler.yaml"))
	out := []interface{}{}
	for i, c := range specCases {
		pod := hivedPod("specs", fmt.Sprintf("spec-%02d", i), c.Spec)
		if c.Spec == "" {
			delete(pod.Annotations, si.AnnotationKeyPodSchedulingSpec)
		}
		record := map[string]interface{}{"case": c.Name, "spec": c.Spec, "pod": pod.Name,
			"namespace": pod.Namespace, "uid": pod.UID}
		func() {
			defer func() {
				if r := recover(); r != nil {
					record["extractError"] = fmt.Sprintf("%v", r)
				}
			}()
			record["extracted"] = internal.ExtractPodSchedulingSpec(pod)
		}()
		b.addPod(pod)
		body := mustJSON(ei.ExtenderArgs{Pod: pod, NodeNames: &[]string{}})
		a := b.http("POST", si.FilterPath, body)
		record["body"] = raw(body)
		record["status"] = a.Status
		record["response"] = raw(a.Body)
		out = append(out, record)
		b.deletePod(pod.Name)
	}
	return out
}

// ---------------------------------------------------------------------------- error paths

func runErrors(root string) []interface{} {
	b := newBox(filepath.Join(root, "example/config/basic/hivedscheduler.yaml"))
	waiting := hivedPod("default", "waiter", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 8\n")
	binding := hivedPod("default", "binder", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\n")
	bound := hivedPod("default", "bound", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\n")
	unknown := hivedPod("default", "stranger", "virtualCluster: VC1\npriority: 1\nleafCellNumber: 1\n")
	for _, p := range []*core.Pod{waiting, binding, bound} {
		b.addPod(p)
	}
	nodes := b.nodes()
	b.filter("filter a pod that must wait", waiting, nodes)
	node := (*b.filter("filter a pod that binds", binding, nodes).NodeNames)[0]
	boundNode := (*b.filter("filter another", bound, nodes).NodeNames)[0]
	b.bind("bind it", bound, boundNode)
	b.filter("filter a bound pod", b.pods["bound"], nodes)
	b.filter("filter a pod not informed", unknown, nodes)
	b.call("filter not JSON", "POST", si.FilterPath, []byte("{nope"), nil)
	b.call("filter without a pod", "POST", si.FilterPath, []byte("{}"), nil)
	b.call("bind not JSON", "POST", si.BindPath, []byte("{nope"), nil)
	b.call("bind without a uid", "POST", si.BindPath,
		mustJSON(ei.ExtenderBindingArgs{PodName: "binder", PodNamespace: "default", Node: node}), nil)
	b.bind("bind on another node", binding, "elsewhere")
	b.bind("bind a waiting pod", waiting, node)
	b.bind("bind a pod not informed", unknown, node)
	b.bind("bind a bound pod", b.pods["bound"], boundNode)
	b.preempt("preempt a binding pod", binding, nodes)
	b.preempt("preempt a pod not informed", unknown, nodes)
	b.call("preempt not JSON", "POST", si.PreemptPath, []byte("{nope"), nil)
	b.call("preempt without a pod", "POST", si.PreemptPath, []byte("{}"), nil)
	b.call("root", "GET", "/", nil, nil)
	b.call("unknown path", "GET", "/v1/nope", nil, nil)
	b.call("unknown group", "GET", si.AffinityGroupsPath+"nope", nil, nil)
	b.call("unknown vc", "GET", si.VirtualClustersPath+"nope", nil, nil)
	b.call("post to inspect", "POST", si.ClusterStatusPath, nil, nil)
	b.call("post to a group", "POST", si.AffinityGroupsPath+"default/bound", nil, nil)
	b.call("a bound pod's group", "GET", si.AffinityGroupsPath+"default/bound", nil, nil)
	return b.steps
}

// ---------------------------------------------------------------------------- verify

// verifyInput: pods bound by another scheduler (sdpaxos's extender), with the annotations
// its Bindings wrote, per HiveD config.
type verifyInput struct {
	Scenarios []struct {
		Name, Config string
		Pods         []struct {
			Namespace, Name, UID, Node string
			Annotations                map[string]string
		}
	}
}

// verify replays the pods as HiveD's restart does (its pod informer's first list: every
// bound pod through addPod, hence AddAllocatedPod) and reports what HiveD made of them.
func verify(root string, in verifyInput) []interface{} {
	out := []interface{}{}
	for _, sc := range in.Scenarios {
		b := newBox(filepath.Join(root, sc.Config))
		pods := []interface{}{}
		for _, p := range sc.Pods {
			pod := hivedPod(p.Namespace, p.Name, "")
			pod.UID = types.UID(p.UID)
			pod.Annotations = p.Annotations
			pod.Spec.NodeName = p.Node
			record := map[string]interface{}{"name": p.Name}
			func() {
				defer func() {
					if r := recover(); r != nil {
						record["panic"] = fmt.Sprintf("%v", r)
					}
				}()
				info := internal.ExtractPodBindInfo(pod)
				record["bindInfo"] = info
				b.s.addPod(pod)
			}()
			status := b.s.podScheduleStatuses[pod.UID]
			record["recovered"] = status != nil && status.PodState == internal.PodBound
			pods = append(pods, record)
		}
		out = append(out, map[string]interface{}{
			"name": sc.Name, "pods": pods, "groups": b.s.getAllAffinityGroups(),
		})
	}
	return out
}

func TestSdpaxosVerify(t *testing.T) {
	in, out, root := os.Getenv("SDPAXOS_VERIFY"), os.Getenv("SDPAXOS_OUT"), os.Getenv("SDPAXOS_HIVED_ROOT")
	if in == "" || out == "" || root == "" {
		t.Skip("run by sdpaxos's tests/k8s/hived_conformance/generate.py --verify")
	}
	data, err := ioutil.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	input := verifyInput{}
	if err := json.Unmarshal(data, &input); err != nil {
		t.Fatal(err)
	}
	result, err := json.MarshalIndent(map[string]interface{}{"scenarios": verify(root, input)}, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := ioutil.WriteFile(out, append(result, '\n'), 0644); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------- main

func TestSdpaxosConformance(t *testing.T) {
	out := os.Getenv("SDPAXOS_OUT")
	root := os.Getenv("SDPAXOS_HIVED_ROOT")
	if out == "" || root == "" {
		t.Skip("run by sdpaxos's tests/k8s/hived_conformance/generate.py")
	}
	doc := map[string]interface{}{
		"schemas":   schemas(),
		"specCases": runSpecCases(root),
		"errors":    runErrors(root),
		"scenarios": []interface{}{
			runScenario(root, scenario{"basic-demo1", "example/config/basic/hivedscheduler.yaml",
				"example/request/basic/request.yaml", []string{"demo1"}, true, true, "all"}),
			runScenario(root, scenario{"basic-demo2nopinned", "example/config/basic/hivedscheduler.yaml",
				"example/request/basic/request.yaml", []string{"demo2nopinned"}, true, false, "all"}),
			runScenario(root, scenario{"basic-demo2pinned", "example/config/basic/hivedscheduler.yaml",
				"example/request/basic/request.yaml", []string{"demo2pinned"}, true, false, "all"}),
			runScenario(root, scenario{"tf-hdtfdemo2", "example/config/basic/hivedscheduler.yaml",
				"example/request/tf/request.yaml", []string{"hdtfdemo2"}, true, false, "all"}),
			// the design cluster's trees are large: its status once filled, once empty
			runScenario(root, scenario{"design-JOBX", "example/config/design/hivedscheduler.yaml",
				"example/request/design/request.yaml", []string{"JOBX"}, true, false, "status"}),
			runScenario(root, scenario{"design-JOBX-empty", "example/config/design/hivedscheduler.yaml",
				"example/request/design/request.yaml", []string{"JOBX"}, false, true, ""}),
		},
	}
	data, err := json.MarshalIndent(doc, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := ioutil.WriteFile(out, append(data, '\n'), 0644); err != nil {
		t.Fatal(err)
	}
}
