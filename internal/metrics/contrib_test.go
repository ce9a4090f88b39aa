package metrics

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// The alert rules (contrib/prometheus) and the Grafana dashboard (contrib/grafana) may name only
// metrics the binary exports: a renamed metric must fail here, not on somebody's pager.

// exportedNames is every metric name a gateway with every layer exports (the collector on the
// full fixture, plus the runtime and process collectors), with a histogram's _bucket, _sum and
// _count series.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	reg, _ := newSource(t)
	names := map[string]bool{}
	for name, mf := range scrape(t, reg) {
		names[name] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[name+s] = true
			}
		}
	}
	return names
}

// TestFixtureExportsEveryFamily: the fixture exportedNames scrapes shows every family the
// collector describes, so "not exported" below never means "not in the fixture".
func TestFixtureExportsEveryFamily(t *testing.T) {
	names := exportedNames(t)
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, d := range allDescs {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		if !names[m[1]] {
			t.Errorf("%s is described but the fixture does not export it", m[1])
		}
	}
}

// prometheusOwn are names Prometheus makes itself, not the binary.
var prometheusOwn = map[string]bool{"up": true}

func TestContribMetricNames(t *testing.T) {
	exported := exportedNames(t)
	sources := map[string][]string{} // file → the metric names it uses
	root := filepath.Join("..", "..", "contrib")

	for _, e := range yamlValues(readFile(t, filepath.Join(root, "prometheus", "alerts.yml")), "expr") {
		sources["alerts.yml"] = append(sources["alerts.yml"], promqlNames(e)...)
	}
	for _, s := range yamlValues(readFile(t, filepath.Join(root, "prometheus", "alerts_test.yml")), "series") {
		sources["alerts_test.yml"] = append(sources["alerts_test.yml"], promqlNames(s)...)
	}
	var dash any
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(root, "grafana", "iser-blk.json"))), &dash); err != nil {
		t.Fatalf("iser-blk.json: %v", err)
	}
	walkJSON(dash, func(key, v string) {
		switch key {
		case "expr", "query", "definition":
			sources["iser-blk.json"] = append(sources["iser-blk.json"], promqlNames(v)...)
		}
	})
	for _, file := range []string{"alerts.yml", "alerts_test.yml", "iser-blk.json"} {
		names := sources[file]
		if len(names) < 3 {
			t.Errorf("%s: found only %v: the extraction is broken", file, names)
		}
		for _, n := range names {
			if !exported[n] && !prometheusOwn[n] {
				t.Errorf("%s uses %s, which the binary does not export", file, n)
			}
		}
	}
	// The rules watch what issue 36 asks of them.
	for _, n := range []string{"up", "iser_blk_gateway_fenced", "iser_blk_gateway_state", "iser_blk_path_up",
		"iser_blk_cache_write_back_errors_total", "iser_blk_cache_dirty_limit_bytes", "iser_blk_no_path_seconds",
		"iser_blk_replacement_timeout_seconds"} {
		if !contains(sources["alerts.yml"], n) {
			t.Errorf("alerts.yml has no rule on %s", n)
		}
	}
}

// TestPromQLNames: the name extraction the test above relies on.
func TestPromQLNames(t *testing.T) {
	for expr, want := range map[string]string{
		`up{job="iser-blk"} == 0`: "up",
		`iser_blk_gateway_state{state="failed"} == 1 unless on (job, instance, name) iser_blk_gateway_fenced == 1`: "iser_blk_gateway_fenced iser_blk_gateway_state",
		`histogram_quantile(0.99, sum by (name, op, le) (rate(x_bucket{name=~"$name"}[5m])))`:                      "x_bucket",
		`increase(x_total[$__rate_interval]) > 1e9 and y offset 5m`:                                                "x_total y",
		`label_values(iser_blk_gateway_state{instance=~"$instance"}, name)`:                                        "iser_blk_gateway_state",
		`'iser_blk_path_up{portal="10.0.0.1:3260", transport="tcp"}'`:                                              "iser_blk_path_up",
		`max by (job) (a) / ignoring(x) group_left(y, z) b or vector(0)`:                                           "a b",
		`{{ $value | humanizeDuration }}`:                                                                          "",
	} {
		got := promqlNames(expr)
		sort.Strings(got)
		if strings.Join(got, " ") != want {
			t.Errorf("%s: %v, want %s", expr, got, want)
		}
	}
}

var (
	promqlStrings   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlMatchers  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promqlGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent     = regexp.MustCompile(`[a-zA-Z_:][\w:]*`)
	labelValuesCall = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][\w:]*)`)
	promqlKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"inf": true, "nan": true, "atan2": true}
)

// promqlNames returns the metric names a PromQL expression (or a series in promtool's notation,
// or a Grafana label_values query) selects: identifiers outside strings, label matchers, ranges
// and grouping lists that neither call a function nor are keywords, numbers or variables.
func promqlNames(expr string) []string {
	if m := labelValuesCall.FindStringSubmatch(expr); m != nil {
		return []string{m[1]}
	}
	if strings.HasPrefix(expr, "'") && strings.HasSuffix(expr, "'") { // a quoted series
		expr = expr[1 : len(expr)-1]
	}
	s := promqlMatchers.ReplaceAllString(expr, " ")
	s = promqlStrings.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, m := range promqlIdent.FindAllStringIndex(s, -1) {
		if m[0] > 0 && isWordByte(s[m[0]-1]) {
			continue // inside a number (1e9), a duration (5m) or a variable ($name)
		}
		name := s[m[0]:m[1]]
		if strings.HasPrefix(strings.TrimLeft(s[m[1]:], " \t\n"), "(") || promqlKeywords[strings.ToLower(name)] {
			continue // a function or aggregation, or a keyword
		}
		names = append(names, name)
	}
	return names
}

func isWordByte(c byte) bool {
	return c == '_' || c == '.' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// yamlValues is the value of every "key:" in a YAML file written as ours are: a scalar on the
// key's line, or a block scalar indented below it.
func yamlValues(doc, key string) []string {
	var out []string
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		v, ok := strings.CutPrefix(strings.TrimLeft(lines[i], " -"), key+":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if v == "|" || v == ">" || v == "" {
			indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
			var block []string
			for i+1 < len(lines) && len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) > indent {
				i++
				block = append(block, strings.TrimSpace(lines[i]))
			}
			v = strings.Join(block, " ")
		}
		out = append(out, v)
	}
	return out
}

func walkJSON(v any, fn func(key, value string)) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok {
				fn(k, s)
			} else {
				walkJSON(x, fn)
			}
		}
	case []any:
		for _, x := range v {
			walkJSON(x, fn)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
