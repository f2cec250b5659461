package main

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// docs returns the rendered documents of kind.
func docs(t *testing.T, out, kind string) []map[string]any {
	t.Helper()
	var found []map[string]any
	for _, doc := range strings.Split(out, "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj["kind"] == kind {
			found = append(found, obj)
		}
	}
	return found
}

// statusRules lists the ClusterRole's rules on resourceclaims/status and
// resourceclaims/driver, as "resource:verbs".
func statusRules(t *testing.T, out string) []string {
	t.Helper()
	var rules []string
	for _, role := range docs(t, out, "ClusterRole") {
		for _, r := range role["rules"].([]any) {
			rule := r.(map[string]any)
			for _, res := range rule["resources"].([]any) {
				if res == "resourceclaims/status" || res == "resourceclaims/driver" {
					var verbs []string
					for _, v := range rule["verbs"].([]any) {
						verbs = append(verbs, v.(string))
					}
					rules = append(rules, res.(string)+":"+strings.Join(verbs, ","))
				}
			}
		}
	}
	return rules
}

// TestClaimStatusByKubeVersion: below 1.36 the API server authorizes
// status writes cluster-wide (reservedFor included), so the chart grants
// no patch on resourceclaims/status and turns claim status off; from 1.36
// it grants it with the node-aware verb on the driver's entries.
func TestClaimStatusByKubeVersion(t *testing.T) {
	tests := []struct {
		kubeVersion, values string
		wantRules           string
		wantFlag            string
	}{
		{"1.34.0", `{}`, "", "--claim-status=false"},
		{"1.35.3", `{}`, "", "--claim-status=false"},
		{"1.36.0", `{}`, "resourceclaims/status:get,patch resourceclaims/driver:associated-node:patch", "--claim-status=true"},
		{"v1.37.2", `{}`, "resourceclaims/status:get,patch resourceclaims/driver:associated-node:patch", "--claim-status=true"},
		{"1.37.2", `{"claimStatus":false}`, "", "--claim-status=false"},
	}
	for _, tt := range tests {
		out, err := renderAt(tt.kubeVersion, chart, "rdma", "rdma-system", tt.values)
		if err != nil {
			t.Fatalf("%s %s: %v", tt.kubeVersion, tt.values, err)
		}
		if got := strings.Join(statusRules(t, out), " "); got != tt.wantRules {
			t.Errorf("%s %s: status rules %q, want %q", tt.kubeVersion, tt.values, got, tt.wantRules)
		}
		if !strings.Contains(out, tt.wantFlag) {
			t.Errorf("%s %s: output lacks %s", tt.kubeVersion, tt.values, tt.wantFlag)
		}
	}
}

// TestSoftwareDevicesOptIn: the default classes leave out Soft-RoCE and
// soft-iWARP; softwareDevices puts them back.
func TestSoftwareDevicesOptIn(t *testing.T) {
	for _, tt := range []struct {
		values   string
		software bool
	}{{`{}`, false}, {`{"deviceClasses":{"softwareDevices":true,"management":true}}`, true}, {`{"deviceClasses":{"management":true}}`, false}} {
		out, err := render(chart, "rdma", "rdma-system", tt.values)
		if err != nil {
			t.Fatal(err)
		}
		classes := docs(t, out, "DeviceClass")
		if len(classes) == 0 {
			t.Fatalf("%s: no DeviceClass", tt.values)
		}
		for _, c := range classes {
			expr := c["spec"].(map[string]any)["selectors"].([]any)[0].(map[string]any)["cel"].(map[string]any)["expression"].(string)
			excludes := strings.Contains(expr, `device.attributes["rdma.dra.dev"].software == false`)
			if excludes == tt.software {
				t.Errorf("%s: class %v selects software devices: %v, want %v (%s)", tt.values, c["metadata"], !excludes, tt.software, expr)
			}
		}
	}
}

// TestAdminGrantPolicy: the policy takes every DeviceClass labelled as an
// admin grant as its parameter and denies, failing closed; the management
// class the chart renders carries that label and grants umad/issm.
func TestAdminGrantPolicy(t *testing.T) {
	out, err := render(chart, "rdma", "rdma-system", `{"deviceClasses":{"management":true}}`)
	if err != nil {
		t.Fatal(err)
	}
	var policy, binding map[string]any
	for _, p := range docs(t, out, "ValidatingAdmissionPolicy") {
		if p["metadata"].(map[string]any)["name"] == "rdma-admin-grants" {
			policy = p
		}
	}
	for _, b := range docs(t, out, "ValidatingAdmissionPolicyBinding") {
		if b["metadata"].(map[string]any)["name"] == "rdma-admin-grants" {
			binding = b
		}
	}
	if policy == nil || binding == nil {
		t.Fatalf("no rdma-admin-grants policy and binding in:\n%s", out)
	}
	spec := policy["spec"].(map[string]any)
	if spec["failurePolicy"] != "Fail" || spec["paramKind"].(map[string]any)["kind"] != "DeviceClass" {
		t.Errorf("policy spec %v: want failurePolicy Fail, paramKind DeviceClass", spec)
	}
	bspec := binding["spec"].(map[string]any)
	labels := bspec["paramRef"].(map[string]any)["selector"].(map[string]any)["matchLabels"].(map[string]any)
	if labels["rdma.dra.dev/admin-grant"] != "true" || bspec["paramRef"].(map[string]any)["parameterNotFoundAction"] != "Allow" {
		t.Errorf("binding paramRef %v", bspec["paramRef"])
	}
	if a := bspec["validationActions"].([]any); len(a) != 1 || a[0] != "Deny" {
		t.Errorf("binding validationActions %v, want [Deny]", a)
	}
	var mgmt map[string]any
	for _, c := range docs(t, out, "DeviceClass") {
		if c["metadata"].(map[string]any)["name"] == "mgmt.rdma.dra.dev" {
			mgmt = c
		}
	}
	if mgmt == nil {
		t.Fatal("no mgmt.rdma.dra.dev class with deviceClasses.management")
	}
	if l := mgmt["metadata"].(map[string]any)["labels"].(map[string]any); l["rdma.dra.dev/admin-grant"] != "true" {
		t.Errorf("mgmt class labels %v", l)
	}
	if b, _ := yaml.Marshal(mgmt["spec"]); !strings.Contains(string(b), "managementDevices: true") {
		t.Errorf("mgmt class spec grants no management devices:\n%s", b)
	}
	out, err = render(chart, "rdma", "rdma-system", `{"policies":{"adminGrants":false}}`)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "admin-grants") || strings.Contains(out, "mgmt.rdma.dra.dev") {
		t.Errorf("adminGrants=false, no management class: still rendered")
	}
}

// TestDefaultsBoundATenant: with its defaults the chart gives a claim that
// asks for nothing a non-zero rdma.max (a twentieth of the published
// capacities), caps what one claim may ask at a quarter of them, leaves
// software devices out of its classes, and on 1.35 grants no cluster-wide
// patch of claim status (TestClaimStatusByKubeVersion has the detail).
func TestDefaultsBoundATenant(t *testing.T) {
	out, err := renderAt("1.35.0", chart, "rdma", "rdma-system", `{"sharing":"shared"}`)
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	for _, ds := range docs(t, out, "DaemonSet") {
		for _, c := range ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any) {
			for _, a := range c.(map[string]any)["args"].([]any) {
				k, v, _ := strings.Cut(a.(string), "=")
				args[k] = v
			}
		}
	}
	for flag, want := range map[string]string{"--hca-handles-per-hca": "1000", "--hca-objects-per-hca": "1000000",
		"--default-hca-handles": "50", "--default-hca-objects": "50000", "--claim-max-percent": "25", "--claim-status": "false"} {
		if args[flag] != want {
			t.Errorf("daemon %s=%q, want %q", flag, args[flag], want)
		}
	}
	for _, c := range docs(t, out, "DeviceClass") {
		expr := c["spec"].(map[string]any)["selectors"].([]any)[0].(map[string]any)["cel"].(map[string]any)["expression"].(string)
		if !strings.Contains(expr, `device.attributes["rdma.dra.dev"].software == false`) {
			t.Errorf("class %v selects software devices by default: %s", c["metadata"], expr)
		}
	}
	if rules := statusRules(t, out); len(rules) > 0 {
		t.Errorf("1.35: the ClusterRole grants %v on claim status", rules)
	}
	for _, bad := range []string{`{"hook":{"claimMaxPercent":0}}`, `{"hook":{"claimMaxPercent":101}}`} {
		if _, err := render(chart, "rdma", "rdma-system", bad); err == nil || !strings.Contains(err.Error(), "claimMaxPercent") {
			t.Errorf("%s: err %v, want one naming claimMaxPercent", bad, err)
		}
	}
}
