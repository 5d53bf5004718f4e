// The Jinja interpreter, one construct at a time, on small hand-written templates with
// expected outputs written from Jinja's documented semantics.
#include "server/jinja/jinja.h"

#include "gtest/gtest.h"

namespace strata::jinja {
namespace {

std::string Render(const std::string& source, const ValueDict& context = {}) {
  auto t = Template::Parse(source);
  EXPECT_TRUE(t.ok()) << t.status() << "\n" << source;
  if (!t.ok()) return "<parse error>";
  auto out = (*t)->Render(context);
  EXPECT_TRUE(out.ok()) << out.status() << "\n" << source;
  return out.ok() ? *out : "<render error>";
}

ValueDict Ctx(const nlohmann::ordered_json& j) { return Value::FromJson(j).dict(); }

TEST(Jinja, TextAndOutput) {
  EXPECT_EQ(Render("plain"), "plain");
  EXPECT_EQ(Render("{{ 'a' + \"b\" }}{{ 1 + 2 }}"), "ab3");
  EXPECT_EQ(Render("{{ x }}|{{ missing }}|", Ctx({{"x", "v"}})), "v||");
  EXPECT_EQ(Render("{# a comment #}x"), "x");
}

TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(Render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(Render("a\n  {%- if true %}b{% endif -%}\n  c"), "abc");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it.
  EXPECT_EQ(Render("{% if true %}\n    x\n    {% endif %}\ny"), "    x\ny");
  EXPECT_EQ(Render("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n"), "  1\n  2\n");
  // {%+ keeps the indentation.
  EXPECT_EQ(Render("  {%+ if true %}x{% endif %}"), "  x");
}

TEST(Jinja, IfElifElse) {
  const std::string t = "{% if n > 1 %}many{% elif n == 1 %}one{% else %}none{% endif %}";
  EXPECT_EQ(Render(t, Ctx({{"n", 5}})), "many");
  EXPECT_EQ(Render(t, Ctx({{"n", 1}})), "one");
  EXPECT_EQ(Render(t, Ctx({{"n", 0}})), "none");
}

TEST(Jinja, ForLoopVariablesFiltersAndElse) {
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index }}/{{ loop.length }}:{{ x }}{% if not loop.last "
                   "%},{% endif %}{% endfor %}",
                   Ctx({{"xs", {"a", "b", "c"}}})),
            "1/3:a,2/3:b,3/3:c");
  EXPECT_EQ(Render("{% for x in xs if x > 1 %}{{ x }}{{ loop.first }}{% endfor %}",
                   Ctx({{"xs", {1, 2, 3}}})),
            "2True3False");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                   Ctx({{"d", {{"b", 1}, {"a", 2}}}})),
            "b=1;a=2;");
  EXPECT_EQ(
      Render("{% for x in [1,2,3,4] %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
      "12");
  EXPECT_EQ(
      Render("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
      "13");
  EXPECT_EQ(Render("{% for m in ms[::-1] %}{{ m }}{% endfor %}", Ctx({{"ms", {1, 2, 3}}})), "321");
}

TEST(Jinja, SetScopesAndNamespaces) {
  // A set inside a loop does not leak; a namespace attribute does.
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(Render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% "
                   "endfor %}{{ ns.x }}"),
            "4");
  EXPECT_EQ(Render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(Render("{% set block %}in {{ 'side' }}{% endset %}[{{ block }}]"), "[in side]");
}

TEST(Jinja, ExpressionsHavePythonSemantics) {
  EXPECT_EQ(Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"),
            "3 -4 1 2 3.5 1024");
  EXPECT_EQ(Render("{{ 'ab' ~ 1 ~ none }} {{ 'x' * 3 }} {{ [1] + [2] }}"), "ab1None xxx [1, 2]");
  EXPECT_EQ(Render("{{ 1 < 2 < 3 }} {{ 'a' in 'cat' }} {{ 3 not in [1, 2] }} {{ 1 == 1.0 }}"),
            "True True True True");
  EXPECT_EQ(Render("{{ 'yes' if x else 'no' }}|{{ 'y' if false }}|", Ctx({{"x", true}})), "yes||");
  EXPECT_EQ(Render("{{ none or 'fallback' }} {{ 0 and 1 }}"), "fallback 0");
  EXPECT_EQ(Render("{{ {'a': 1, 'b': [true, none]} }} {{ 1.0 }} {{ 0.1 }} {{ 1e-05 }}"),
            "{'a': 1, 'b': [True, None]} 1.0 0.1 1e-05");
  EXPECT_EQ(Render("{{ 'héllo'[1] }} {{ 'héllo'[-1] }} {{ 'héllo'[1:3] }} {{ [1,2,3,4][1::2] }}"),
            "é o él [2, 4]");
}

TEST(Jinja, TestsAndFilters) {
  const auto ctx = Ctx({{"s", "  Hi  "}, {"l", {3, 1, 2}}, {"d", {{"k", "v"}}}, {"n", nullptr}});
  EXPECT_EQ(Render("{{ s is string }} {{ l is string }} {{ n is none }} {{ x is defined }} {{ d is "
                   "mapping }} "
                   "{{ 4 is divisibleby 2 }} {{ 3 is odd }} {{ s is not none }}",
                   ctx),
            "True False True False True True True True");
  EXPECT_EQ(Render("[{{ s | trim }}] {{ l | length }} {{ l | sort | join('-') }} {{ l | first }} "
                   "{{ l | last }} "
                   "{{ missing | default('d') }} {{ '' | default('e', true) }} {{ 'ab' | upper }}",
                   ctx),
            "[Hi] 3 1-2-3 3 2 d e AB");
  EXPECT_EQ(
      Render("{{ d | tojson }} {{ ['a', 1.5, true, none] | tojson }} {{ 'é\"\\n' | tojson }}", ctx),
      R"({"k": "v"} ["a", 1.5, true, null] "é\"\n")");
  EXPECT_EQ(Render("{{ {'a': [1, 2]} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
  const auto msgs =
      Ctx({{"m", {{{"role", "system"}, {"c", "x"}}, {{"role", "user"}, {"c", "y"}}}}});
  EXPECT_EQ(Render("{{ m | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }} "
                   "{{ m | rejectattr('role', 'eq', 'user') | list | length }}",
                   msgs),
            "['y'] 1");
  EXPECT_EQ(
      Render(
          "{{ 'a\\nb' | indent(2) }}|{{ [1, 1, 2] | unique | list }}|{{ l | sum }}|{{ l | max }}",
          ctx),
      "a\n  b|[1, 2]|6|3");
}

TEST(Jinja, StringAndDictMethods) {
  EXPECT_EQ(Render("{{ ' a b '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\na'.lstrip('\\n') "
                   "}}|{{ 'a,b,,c'.split(',') }}|"
                   "{{ ' a  b '.split() }}|{{ 'a</t>b</t>c'.split('</t>')[-1] }}"),
            "a b|a|a|['a', 'b', '', 'c']|['a', 'b']|c");
  EXPECT_EQ(Render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ "
                   "'aXa'.replace('a', 'b') }} "
                   "{{ 'hello world'.title() }} {{ 'ab'.upper() }} {{ 'a-b'.find('-') }}"),
            "True True bXb Hello World AB 1");
  EXPECT_EQ(
      Render(
          "{{ d.get('k') }} {{ d.get('z', 'dflt') }} {{ d.keys() | list }} {{ d['k'] }} {{ d.k }}",
          Ctx({{"d", {{"k", "v"}}}})),
      "v dflt ['k'] v v");
}

TEST(Jinja, MacrosAndFunctions) {
  EXPECT_EQ(Render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('A') }} {{ greet('B', punct='?') }}"),
            "Hi A! Hi B?");
  EXPECT_EQ(Render("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ dict(a=1).a }}"),
            "[0, 1, 2] [1, 3, 5] 1");
  auto t = Template::Parse("{% if x %}{{ raise_exception('roles must alternate') }}{% endif %}");
  ASSERT_TRUE(t.ok());
  auto out = (*t)->Render(Ctx({{"x", true}}));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "roles must alternate");
}

TEST(Jinja, UnsupportedConstructsFailAtParseTime) {
  for (const std::string bad :
       {"{% include 'x' %}", "{{ x | nosuchfilter }}", "{{ x is nosuchtest }}",
        "{{ nosuchfunction() }}", "{{ x.nosuchmethod() }}", "{% if x %}", "{{ 'a' ",
        "{% for x in %}{% endfor %}", "{{ x $ y }}"}) {
    auto t = Template::Parse(bad);
    EXPECT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find("line"), std::string::npos) << t.status();
  }
}

}  // namespace
}  // namespace strata::jinja
