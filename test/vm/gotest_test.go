package vm

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseTestOutput(t *testing.T) {
	out := strings.Split(`=== RUN   TestA
    a_test.go:1: hello
--- PASS: TestA (0.00s)
=== RUN   TestB
=== RUN   TestB/x
=== RUN   TestB/y
--- FAIL: TestB (1.28s)
    --- PASS: TestB/x (0.01s)
    --- FAIL: TestB/y (0.01s)
        b_test.go:9: port 1 netdev: discovery "", kernel "eth0"
=== RUN   TestC
    c_test.go:3: no siw
--- SKIP: TestC (0.00s)
=== RUN   TestD
panic: boom
FAIL`, "\n")
	tests, rest := ParseTestOutput(out)
	type sum struct{ Name, Status, Has string }
	var got []sum
	for _, g := range tests {
		got = append(got, sum{g.Name, g.Status, strings.Join(g.Output, "|")})
	}
	want := []sum{
		{"TestA", "PASS", `    a_test.go:1: hello|--- PASS: TestA (0.00s)`},
		{"TestB", "FAIL", `=== RUN   TestB/x|=== RUN   TestB/y|--- FAIL: TestB (1.28s)|    --- PASS: TestB/x (0.01s)|    --- FAIL: TestB/y (0.01s)|        b_test.go:9: port 1 netdev: discovery "", kernel "eth0"`},
		{"TestC", "SKIP", `    c_test.go:3: no siw|--- SKIP: TestC (0.00s)`},
		{"TestD", "", `panic: boom`},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if !reflect.DeepEqual(rest, []string{"FAIL"}) {
		t.Errorf("rest = %q", rest)
	}
}
