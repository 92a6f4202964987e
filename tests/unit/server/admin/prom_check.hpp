#pragma once
// A strict checker for the Prometheus text exposition format 0.0.4, written for the tests
// (python's prometheus_client is not available here). It returns every sample as
// `name{labels}` → value, or an error naming the offending line. Rules checked:
// - lines end in LF, the text ends in LF; `# HELP name text` escapes only `\\` and `\n`;
//   `# TYPE name counter|gauge|histogram|summary|untyped`, at most once per name, before
//   any sample of that name, HELP at most once per name;
// - samples `name{l="v",...} value`: metric and label names well formed, label values with
//   only `\\`, `\"`, `\n` escapes, no repeated label, value a Go-parsable float or +Inf,
//   -Inf, NaN; an optional integer timestamp; no sample repeated;
// - a family's samples are contiguous; histogram samples are `_bucket` (with `le`), `_sum`
//   and `_count`; per label set the `le` values ascend to `+Inf`, bucket counts never go
//   down, and the `+Inf` bucket equals `_count`.

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace wspush::test {

struct prom_result {
  std::string error;                      // empty when the text is valid
  std::map<std::string, double> samples;  // "name{a=\"x\"}" (labels as written) → value
  std::map<std::string, std::string> types;
};

namespace prom_detail {

inline bool is_name(std::string_view s, bool colon) {
  if (s.empty()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

inline bool parse_value(std::string_view s, double& v) {
  if (s == "+Inf" || s == "Inf") return v = HUGE_VAL, true;
  if (s == "-Inf") return v = -HUGE_VAL, true;
  if (s == "NaN") return v = NAN, true;
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) return false;
  const std::string t(s);
  char* end = nullptr;
  v = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

struct sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // unescaped values
  std::string key;                                          // name{labels} as written
  double value = 0;
};

/// Parses `{a="x",b="y"}` starting at s[0] == '{'; advances s past it.
inline std::string parse_labels(std::string_view& s, sample& out) {
  s.remove_prefix(1);
  std::set<std::string> seen;
  while (true) {
    if (!s.empty() && s.front() == '}') return s.remove_prefix(1), "";
    std::size_t eq = s.find('=');
    if (eq == std::string_view::npos) return "label without '='";
    const std::string name(s.substr(0, eq));
    if (!is_name(name, false)) return "bad label name '" + name + "'";
    if (!seen.insert(name).second) return "repeated label " + name;
    s.remove_prefix(eq + 1);
    if (s.empty() || s.front() != '"') return "label value not quoted";
    s.remove_prefix(1);
    std::string value;
    while (true) {
      if (s.empty()) return "unterminated label value";
      const char c = s.front();
      s.remove_prefix(1);
      if (c == '"') break;
      if (c == '\n') return "raw newline in label value";
      if (c != '\\') {
        value += c;
        continue;
      }
      if (s.empty()) return "dangling escape";
      const char e = s.front();
      s.remove_prefix(1);
      if (e == 'n') value += '\n';
      else if (e == '\\' || e == '"') value += e;
      else return std::string("bad escape \\") + e;
    }
    out.labels.emplace_back(name, value);
    if (!s.empty() && s.front() == ',') s.remove_prefix(1);
    else if (s.empty() || s.front() != '}') return "expected ',' or '}' after a label";
  }
}

inline std::string parse_sample(std::string_view line, sample& out) {
  std::size_t n = 0;
  while (n < line.size() && line[n] != '{' && line[n] != ' ') ++n;
  out.name = std::string(line.substr(0, n));
  if (!is_name(out.name, true)) return "bad metric name '" + out.name + "'";
  std::string_view rest = line.substr(n);
  if (!rest.empty() && rest.front() == '{')
    if (std::string e = parse_labels(rest, out); !e.empty()) return e;
  out.key = std::string(line.substr(0, line.size() - rest.size()));
  if (rest.empty() || rest.front() != ' ') return "no space before the value";
  rest.remove_prefix(1);
  const std::size_t sp = rest.find(' ');
  if (!parse_value(rest.substr(0, sp), out.value)) return "bad value '" + std::string(rest.substr(0, sp)) + "'";
  if (sp != std::string_view::npos) {
    const std::string_view ts = rest.substr(sp + 1);
    if (ts.empty() || ts.find_first_not_of("-0123456789") != std::string_view::npos) return "bad timestamp";
  }
  return "";
}

/// The family a sample belongs to, given the declared types.
inline std::string family_of(const std::string& name, const std::map<std::string, std::string>& types) {
  for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string base = name.substr(0, name.size() - suffix.size());
    const auto t = types.find(base);
    if (t != types.end() && (t->second == "histogram" || (t->second == "summary" && suffix != "_bucket"))) return base;
  }
  return name;
}

/// Histogram rules for one family's samples.
inline std::string check_histogram(const std::string& fam, const std::vector<sample>& samples) {
  struct per_set {
    double last_le = -HUGE_VAL, last_count = 0, inf = -1, count = -1;
    bool sum = false;
  };
  std::map<std::string, per_set> sets;
  for (const sample& s : samples) {
    std::string set_key, le;
    for (const auto& [k, v] : s.labels)
      if (k == "le") le = v;
      else set_key += k + "=" + v + ",";
    per_set& p = sets[set_key];
    if (s.name == fam + "_bucket") {
      double b;
      if (le.empty() || !parse_value(le, b)) return fam + ": bucket without a valid le";
      if (b <= p.last_le) return fam + ": le values not ascending";
      if (s.value < p.last_count) return fam + ": bucket counts go down";
      p.last_le = b, p.last_count = s.value;
      if (std::isinf(b)) p.inf = s.value;
    } else if (s.name == fam + "_count") {
      p.count = s.value;
    } else if (s.name == fam + "_sum") {
      p.sum = true;
    } else {
      return fam + ": unexpected histogram sample " + s.name;
    }
  }
  for (const auto& [k, p] : sets) {
    if (p.inf < 0) return fam + ": no +Inf bucket";
    if (p.count != p.inf) return fam + ": _count differs from the +Inf bucket";
    if (!p.sum) return fam + ": no _sum";
  }
  return "";
}

}  // namespace prom_detail

inline prom_result check_prometheus_text(std::string_view text) {
  using namespace prom_detail;
  prom_result r;
  std::set<std::string> helps, done_families;
  std::string current;  // family whose samples are being read
  std::map<std::string, std::vector<sample>> by_family;
  if (!text.empty() && text.back() != '\n') return r.error = "text does not end in LF", r;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const std::size_t lf = text.find('\n');
    const std::string_view line = text.substr(0, lf);
    text.remove_prefix(lf + 1);
    ++line_no;
    const std::string where = "line " + std::to_string(line_no) + " '" + std::string(line) + "': ";
    if (line.empty()) continue;
    if (line.substr(0, 7) == "# HELP " || line.substr(0, 7) == "# TYPE ") {
      const bool help = line[2] == 'H';
      const std::string_view rest = line.substr(7);
      const std::size_t sp = rest.find(' ');
      const std::string name(rest.substr(0, sp));
      const std::string_view tail = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
      if (!is_name(name, true)) return r.error = where + "bad name", r;
      if (help) {
        if (!helps.insert(name).second) return r.error = where + "second HELP", r;
        for (std::size_t i = 0; i < tail.size(); ++i)
          if (tail[i] == '\\' && (i + 1 == tail.size() || (tail[i + 1] != '\\' && tail[i + 1] != 'n')))
            return r.error = where + "bad escape in HELP", r;
          else if (tail[i] == '\\') ++i;
        continue;
      }
      if (r.types.count(name)) return r.error = where + "second TYPE", r;
      if (by_family.count(name)) return r.error = where + "TYPE after samples", r;
      if (tail != "counter" && tail != "gauge" && tail != "histogram" && tail != "summary" && tail != "untyped")
        return r.error = where + "unknown type", r;
      r.types[name] = std::string(tail);
      continue;
    }
    if (line.front() == '#') continue;  // a comment
    sample s;
    if (std::string e = parse_sample(line, s); !e.empty()) return r.error = where + e, r;
    const std::string fam = family_of(s.name, r.types);
    if (fam != current) {
      if (done_families.count(fam)) return r.error = where + "family " + fam + " is not contiguous", r;
      if (!current.empty()) done_families.insert(current);
      current = fam;
    }
    if (!r.samples.emplace(s.key, s.value).second) return r.error = where + "repeated sample", r;
    by_family[fam].push_back(std::move(s));
  }
  for (const auto& [fam, samples] : by_family)
    if (r.types.count(fam) && r.types[fam] == "histogram")
      if (std::string e = check_histogram(fam, samples); !e.empty()) return r.error = e, r;
  return r;
}

}  // namespace wspush::test
