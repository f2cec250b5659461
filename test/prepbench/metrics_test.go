package prepbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// sample is a Prometheus text exposition's values summed by a key the
// caller picks from each line's labels.
type sample map[string]float64

var metricLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([0-9.eE+-]+|NaN|[+-]Inf)$`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// parseMetrics sums the values of metric name in r by key(labels).
func parseMetrics(r io.Reader, name string, key func(labels map[string]string) string) (sample, error) {
	out := sample{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := metricLine.FindStringSubmatch(sc.Text())
		if m == nil || m[1] != name {
			continue
		}
		labels := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[3], -1) {
			labels[p[1]] = p[2]
		}
		v, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sc.Text(), err)
		}
		out[key(labels)] += v
	}
	return out, sc.Err()
}

// apiCalls counts the API server's requests by verb and resource
// (apiserver_request_total), e.g. "GET resourceclaims",
// "APPLY resourceclaims/status".
func (w *world) apiCalls(ctx context.Context) (sample, error) {
	raw, err := w.cp.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return parseMetrics(strings.NewReader(string(raw)), "apiserver_request_total", func(l map[string]string) string {
		res := l["resource"]
		if res == "" {
			return "" // not a resource (/metrics itself)
		}
		if l["subresource"] != "" {
			res += "/" + l["subresource"]
		}
		return l["verb"] + " " + res
	})
}

// daemonMetric sums the daemon's metric name over its labels.
func (w *world) daemonMetric(ctx context.Context, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.metricsURL, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	s, err := parseMetrics(resp.Body, name, func(map[string]string) string { return "" })
	return s[""], err
}

// perClaim is after minus before, divided by n, as "GET resourceclaims
// 1.00, ..." sorted, leaving out what did not change.
func perClaim(before, after sample, n int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if d := after[k] - before[k]; d > 0 && k != "" {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, d/float64(n)))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
