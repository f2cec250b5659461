package vm

// Parsing a test binary's -test.v output into its top-level tests, so the
// host's go test can show each guest test as a subtest of its own.

import (
	"regexp"
	"strings"
)

// GuestTest is one top-level test of the guest binary.
type GuestTest struct {
	Name   string
	Status string // PASS, FAIL, SKIP; "" when it never finished
	Output []string
}

var (
	runLine = regexp.MustCompile(`^=== (RUN|NAME|CONT|PAUSE)\s+(\S+)`)
	endLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+) \(`)
)

// ParseTestOutput splits -test.v output by top-level test, in the order
// they started. Lines before the first test and the binary's final
// PASS/FAIL go to rest; anything else after a test ended stays with it.
func ParseTestOutput(lines []string) (tests []*GuestTest, rest []string) {
	byName := map[string]*GuestTest{}
	var cur *GuestTest
	get := func(full string) *GuestTest {
		top, _, _ := strings.Cut(full, "/")
		g, ok := byName[top]
		if !ok {
			g = &GuestTest{Name: top}
			byName[top] = g
			tests = append(tests, g)
		}
		return g
	}
	for _, l := range lines {
		if m := runLine.FindStringSubmatch(l); m != nil {
			cur = get(m[2])
			if m[1] == "RUN" && strings.Contains(m[2], "/") {
				cur.Output = append(cur.Output, l)
			}
			continue
		}
		if m := endLine.FindStringSubmatch(l); m != nil {
			g := get(m[2])
			g.Output = append(g.Output, l)
			if !strings.Contains(m[2], "/") {
				g.Status = m[1]
			}
			// A failed test's messages can follow its end line.
			cur = g
			continue
		}
		if l == "PASS" || l == "FAIL" {
			rest = append(rest, l)
			continue
		}
		if cur != nil {
			cur.Output = append(cur.Output, l)
		} else {
			rest = append(rest, l)
		}
	}
	return tests, rest
}
