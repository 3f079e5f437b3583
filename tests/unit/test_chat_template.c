/* test_chat_template.c - text/chat_template: each supported construct
 * with the text Jinja gives, the refusal of each unsupported one (naming it
 * and its line), raise_exception(), the limits against hostile templates,
 * and the built-ins. tests/chat compares whole templates with
 * @huggingface/jinja; these cover what that renderer lacks too (tests with
 * arguments, select/reject, string comparison). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"
#include "text/chat_template.h"

static const char *kContext =
    "{\"messages\": [{\"role\": \"system\", \"content\": \" sys \"},"
    "  {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}],"
    " \"xs\": [3, 1, 2], \"d\": {\"b\": 2, \"a\": 1}, \"s\": \"  Hello, World  \", \"n\": 7,"
    " \"f\": 2.5, \"t\": true, \"z\": null, \"e\": \"\", \"u\": \"h\\u00e9llo\","
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

/* Renders source with kContext; returns the text (static) or fails the test. */
static const char *render(const char *source) {
  static char *last;
  free(last);
  last = NULL;
  json_t *ctx = json_loads(kContext, 0, NULL);
  assert_non_null(ctx);
  tmpl_t *t = NULL;
  char err[512];
  int rc = tmpl_parse(source, &t, err, sizeof err);
  if (rc) fail_msg("parse of [%s] failed: %s", source, err);
  rc = tmpl_render(t, ctx, &last, err, sizeof err);
  if (rc) fail_msg("render of [%s] failed: %s", source, err);
  tmpl_free(t);
  json_decref(ctx);
  return last;
}

/* Parses and renders source expecting code; returns the message (static). */
static const char *failure(const char *source, int code) {
  static char err[512];
  json_t *ctx = json_loads(kContext, 0, NULL);
  tmpl_t *t = NULL;
  char *out = NULL;
  int rc = tmpl_parse(source, &t, err, sizeof err);
  if (!rc) {
    rc = tmpl_render(t, ctx, &out, err, sizeof err);
    assert_null(out);
  } else {
    assert_null(t);
  }
  tmpl_free(t);
  json_decref(ctx);
  if (rc != code) fail_msg("[%.80s] gave %d (%s), not %d", source, rc, err, code);
  return err;
}

#define assert_render(source, want) assert_string_equal(render(source), want)
#define assert_fails(source, code, want_msg) assert_string_equal(failure(source, code), want_msg)

static void test_text_and_whitespace(void **state) {
  (void)state;
  assert_render("plain", "plain");
  assert_render("one newline dropped\n", "one newline dropped");
  assert_render("a\n\n", "a\n");
  /* trim_blocks and lstrip_blocks, as Hugging Face renders */
  assert_render("a\n{% if true %}\nb\n{% endif %}\nc", "a\nb\nc");
  assert_render("a\n    {% if true %}\n    b\n    {% endif %}\nc", "a\n    b\nc");
  assert_render("  {{ 'x' }}  \n", "  x  ");
  assert_render("a   {%- if true -%}   b   {%- endif -%}   c", "abc");
  assert_render("a \n {{- 'x' -}} \n b", "axb");
  assert_render("x {#- c -#} y {# keep #} z", "xy  z");
  assert_render("a\n{# c #}\nb", "a\nb");
  assert_render("{%- generation %}kept{% endgeneration -%}  after", "keptafter");
  /* unicode spaces count as whitespace for -, as \s does */
  assert_render("a\xc2\xa0\xe3\x80\x80{{- 'b' }}", "ab");
}

static void test_literals_and_output(void **state) {
  (void)state;
  assert_render("{{ 1 }}|{{ -3 }}|{{ 2.5 }}|{{ 2.0 }}|{{ 1000 if false else 0.1 }}",
                "1|-3|2.5|2.0|0.1");
  assert_render("{{ true }}|{{ False }}|{{ none }}|{{ None }}|{{ nope }}", "true|false|||");
  assert_render("{{ 'q\\'s' }}|{{ \"d\\\"q\" }}|{{ 'a\\tb\\n\\u00e9\\x41\\ud83d\\ude00' }}",
                "q's|d\"q|a\tb\n\xc3\xa9"
                "A\xf0\x9f\x98\x80");
  assert_render("{{ [1, 'a', none, true] }}|{{ {'k': 'v', 'n': 1} }}|{{ [] }}|{{ {} }}",
                "[1, \"a\", null, true]|{\"k\": \"v\", \"n\": 1}|[]|{}");
  assert_render("{{ 0.1 + 0.2 }} {{ 100000000000000000000.0 }} {{ 1/3 }}",
                "0.30000000000000004 100000000000000000000.0 0.3333333333333333");
  assert_render("{{ ('a', 'b') }}", "[\"a\", \"b\"]");
}

static void test_arithmetic(void **state) {
  (void)state;
  assert_render("{{ 7 + 2 }} {{ 7 - 2 }} {{ 7 * 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 3 }}",
                "9 5 14 3.5 3 1");
  assert_render("{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ 6 / 3 }} {{ -7 // 2 }} {{ -7 % 3 }}",
                "1024 0.5 2.5 2.0 -4 2");
  assert_render("{{ 10 - 3 - 2 }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ -3|abs }} {{ -2 ** 2 }}",
                "5 14 20 3 4");
  assert_render("{{ 'a' + 'b' }} {{ 'a' ~ 1 ~ true ~ nope }} {{ 'n=' + n }} {{ xs + [4] }}",
                "ab a1true n=7 [3, 1, 2, 4]");
  assert_render("{{ 'ab' * 3 }} {{ [0] * 2 }}", "ababab [0, 0]");
  assert_fails("{{ 1 // 0 }}", TY_EINVAL, "chat template line 1: division by zero");
  assert_fails("\n{{ 9223372036854775807 + 1 }}", TY_EINVAL,
               "chat template line 2: integer overflow");
  assert_fails("{{ nope + 1 }}", TY_EINVAL,
               "chat template line 1: cannot apply + to undefined and an integer");
  assert_fails("{{ xs - 1 }}", TY_EINVAL,
               "chat template line 1: cannot apply - to a list and an integer");
}

static void test_comparisons_and_logic(void **state) {
  (void)state;
  assert_render(
      "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 'a' != 'b' }}",
      "true true false true true true");
  assert_render("{{ true and false }} {{ true or false }} {{ not true }} {{ not z }}",
                "false true false true");
  assert_render("{{ e or 'dflt' }} {{ s and 'yes' }} {{ 0 or [] }} {{ [1] == [1] }}",
                "dflt yes [] true");
  assert_render("{{ 'H' in s }} {{ 'x' not in s }} {{ 2 in xs }} {{ 'a' in d }} {{ 1 in nope }}",
                "true true true true false");
  assert_render("{{ 'yes' if t else 'no' }} {{ 'yes' if z else 'no' }} [{{ 'only' if false }}]",
                "yes no []");
  assert_fails("{{ 1 < 'a' }}", TY_EINVAL,
               "chat template line 1: cannot compare an integer < a string");
}

static void test_access_and_slices(void **state) {
  (void)state;
  assert_render("{{ messages[0].role }} {{ messages[1]['content'] }} {{ messages[-1].content }}",
                "system Hi Yo");
  assert_render("{{ d.missing }}|{{ xs[10] }}|{{ nope.x }}|{{ xs.0 }}", "|||3");
  assert_render("{{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[-2:] }} {{ xs[5:] }}",
                "[1, 2] [3, 1] [2, 1, 3] [1, 2] []");
  assert_render("{{ s[2:7] }} {{ u[1:3] }} {{ u[1] }} {{ u[::-1] }}",
                "Hello \xc3\xa9l \xc3\xa9 oll\xc3\xa9h");
  assert_fails("{{ xs[::0] }}", TY_EINVAL, "chat template line 1: slice step cannot be zero");
  assert_fails("{{ d[0] }}", TY_EINVAL,
               "chat template line 1: a dict is indexed by strings, not by an integer");
}

static void test_tests(void **state) {
  (void)state;
  assert_render("{{ n is defined }} {{ nope is defined }} {{ nope is undefined }} {{ z is none }}",
                "true false true true");
  assert_render("{{ n is not none }} {{ s is string }} {{ n is number }} {{ n is integer }}",
                "true true true true");
  assert_render("{{ f is float }} {{ t is boolean }} {{ d is mapping }} {{ xs is iterable }}",
                "true true true true");
  assert_render("{{ n is iterable }} {{ xs is sequence }} {{ n is odd }} {{ n is even }}",
                "false true true false");
  assert_render(
      "{{ n is divisibleby 7 }} {{ n is divisibleby(2) }} {{ 'ab' is lower }} {{ 'AB' is upper }}",
      "true false true true");
  assert_render("{{ n is equalto 7 }} {{ n is eq(8) }} {{ t is true }} {{ t is false }}",
                "true false true false");
  assert_render(
      "{{ 'x' is in('xyz') }} {{ n is ne 7 }} {{ n is sameas 7 }} {{ strftime_now is defined }}",
      "true false true true");
}

static void test_filters(void **state) {
  (void)state;
  assert_render("[{{ s|trim }}] [{{ s|upper }}] [{{ s|lower }}] [{{ 'xxhixx'|trim('x') }}]",
                "[Hello, World] [  HELLO, WORLD  ] [  hello, world  ] [hi]");
  assert_render("[{{ 'hello world'|capitalize }}] [{{ 'hello big-world'|title }}]",
                "[Hello world] [Hello Big-World]");
  assert_render("{{ xs|length }} {{ s|length }} {{ d|length }} {{ u|length }} {{ xs|count }}",
                "3 16 2 5 3");
  assert_render("{{ xs|first }} {{ xs|last }} {{ u|first }} {{ u|last }} [{{ []|first }}]",
                "3 2 h o []");
  assert_render(
      "{{ xs|join(', ') }} {{ xs|join }} {{ 'abc'|join('-') }} {{ messages|join('|', "
      "attribute='role') }}",
      "3, 1, 2 312 a-b-c system|user|assistant");
  assert_render(
      "{{ s|replace('l', 'L') }} {{ s|replace('l', 'L', 2) }} {{ 'ab'|replace('', '.') }}",
      "  HeLLo, WorLd     HeLLo, World   .a.b.");
  assert_render(
      "{{ nope|default('dflt') }} [{{ e|default('dflt') }}] {{ e|default('dflt', true) }} "
      "{{ n|default(0) }} {{ nope|d('x') }} {{ e|d('y', boolean=true) }}",
      "dflt [] dflt 7 x y");
  assert_render("{{ d|tojson }} {{ s|tojson }} {{ z|tojson }} {{ '\\u00e9\\n\"\\x01'|tojson }}",
                "{\"b\": 2, \"a\": 1} \"  Hello, World  \" null \"\xc3\xa9\\n\\\"\\u0001\"");
  assert_render("{{ d|tojson(indent=2) }}|{{ [[], {}]|tojson(indent=1) }}",
                "{\n  \"b\": 2,\n  \"a\": 1\n}|[\n [],\n {}\n]");
  assert_render("{{ n|string }} {{ f|string }} {{ xs|string }} {{ '42'|int + 1 }} {{ 'x'|int }}",
                "7 2.5 [3, 1, 2] 43 0");
  assert_render("{{ '2.5'|float }} {{ f|int }} {{ n|float }}", "2.5 2 7.0");
  assert_render("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", "b=2;a=1;");
  assert_render(
      "{{ xs|reverse|list }} {{ 'abc'|reverse }} {{ u|list|length }} {{ d|list }} {{ 'x'|safe }}",
      "[2, 1, 3] cba 5 [\"b\", \"a\"] x");
  assert_render(
      "{{ messages|map(attribute='role')|join(',') }} "
      "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} "
      "{{ messages|rejectattr('role', 'equalto', 'user')|map(attribute='content')|join('/') }}",
      "system,user,assistant 1  sys /Yo");
  assert_render(
      "{{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} "
      "{{ ['a', 'code', 'b']|reject('equalto', 'code')|join(', ') }} {{ [0, 1, '', "
      "'x']|select|list }}",
      "[3, 1] [2] a, b [1, \"x\"]");
  assert_render("{{ ['a', 'b']|map('upper')|join }}", "AB");
  /* today's date, as Llama 3.2's template asks for it */
  assert_render("{{ strftime_now('%Y-%m-%d')|length }} {{ strftime_now('%d %b %Y')[2:3] }}",
                "10  ");
  assert_fails("{{ n|trim }}", TY_EINVAL,
               "chat template line 1: filter 'trim' needs a string, not an integer");
  assert_fails("{{ d|tojson(sort_keys=true) }}", TY_EINVAL,
               "chat template line 1: filter 'tojson' takes no argument 'sort_keys'");
}

static void test_methods(void **state) {
  (void)state;
  assert_render(
      "[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ 'xxhixx'.strip('x') }}]",
      "[Hello, World] [Hello, World  ] [  Hello, World] [hi]");
  assert_render("{{ s.upper() }}|{{ s.lower() }}|{{ 'a b'.title() }}|{{ 'aB'.capitalize() }}",
                "  HELLO, WORLD  |  hello, world  |A B|AB");
  assert_render(
      "{{ s.strip().startswith('Hello') }} {{ s.endswith('  ') }} {{ 'abc'.startswith(('x', 'a')) "
      "}}",
      "true true true");
  assert_render(
      "{{ s.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }} {{ ' a  b "
      "'.split(none, 1) }}",
      "[\"Hello,\", \"World\"] [\"a\", \"b\", \"\", \"c\"] [\"a\", \"b c\"] [\"a\", \"b \"]");
  assert_render(
      "{{ d.keys()|list }} {{ d.values()|list }} {% for k, v in d.items() %}{{ k }}:{{ v }} {% "
      "endfor %}",
      "[\"b\", \"a\"] [2, 1] b:2 a:1 ");
  assert_render("{{ d.get('a') }} {{ d.get('zz', 'none here') }} [{{ d.get('zz') }}]",
                "1 none here []");
  assert_render("{{ 'a-b-c'.replace('-', '+') }} {{ 'Think</think>answer'.split('</think>')[-1] }}",
                "a+b+c answer");
  assert_fails("{{ n.strip() }}", TY_EINVAL,
               "chat template line 1: strip needs a string, not an integer");
}

static void test_statements(void **state) {
  (void)state;
  assert_render(
      "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/{{ loop.first }}/"
      "{{ loop.last }}/{{ loop.revindex }} {% endfor %}",
      "1/0/3/true/false/3 2/1/3/false/false/2 3/2/3/false/true/1 ");
  assert_render("{% for x in xs %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }} {% endfor %}",
                "<3>1 3<1>2 1<2> ");
  assert_render(
      "{% for x in [] %}never{% else %}empty{% endfor %} {% for x in xs %}{{ x }}{% else %}no{% "
      "endfor %}",
      "empty 312");
  assert_render("{% for x in xs if x > 1 %}{{ x }}:{{ loop.index }}:{{ loop.length }} {% endfor %}",
                "3:1:2 2:2:2 ");
  assert_render(
      "{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if loop.index > 2 %}"
      "{% break %}{% endif %}{{ x }}{% endfor %}",
      "3");
  assert_render(
      "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }} {% endfor %}{% for k in d %}{{ k }}{% endfor "
      "%}"
      "{% for c in 'h\\u00e9' %}[{{ c }}]{% endfor %}",
      "3 7 ba[h][\xc3\xa9]");
  assert_render(
      "{% for i in range(3) %}{{ i }}{% endfor %} {{ range(2, 10, 3)|list }} {{ range(5, 0, "
      "-2)|list }}",
      "012 [2, 5, 8] [5, 3, 1]");
  assert_render(
      "{% if n > 10 %}big{% elif n > 5 %}medium{% elif n > 0 %}small{% else %}none{% endif %}",
      "medium");
  assert_render("{% set x = 1 %}{% set y = x + 1 %}{{ x }}{{ y }}{% set x = 'shadow' %}{{ x }}",
                "12shadow");
  /* a loop's sets stay in the loop; a namespace carries them out */
  assert_render("{% set c = 0 %}{% for m in messages %}{% set c = c + 1 %}{% endfor %}{{ c }}",
                "0");
  assert_render(
      "{% set ns = namespace(count=0, seen=false) %}{% for m in messages %}"
      "{% set ns.count = ns.count + 1 %}{% if m.role == 'user' %}{% set ns.seen = true %}"
      "{% endif %}{% endfor %}{{ ns.count }} {{ ns.seen }}",
      "3 true");
  assert_render("{% set block %}inner {{ n }}{% endset %}[{{ block }}]", "[inner 7]");
  assert_render("{% set messages = messages[1:] %}{{ messages|length }} {{ messages[0].role }}",
                "2 user");
  assert_render(
      "{% for m in messages %}{% for x in xs %}{{ loop.index }}{% endfor %}{{ loop.index }};{% "
      "endfor %}",
      "1231;1232;1233;");
  assert_fails("{% for a, b in xs %}{% endfor %}", TY_EINVAL,
               "chat template line 1: cannot unpack an integer into 2 loop variables");
  assert_fails("{% for x in n %}{% endfor %}", TY_EINVAL,
               "chat template line 1: cannot loop over an integer");
  assert_fails(
      "{% set d.x = 1 %}", TY_EINVAL,
      "chat template line 1: cannot set attribute 'x' of a dict 'd': only namespace() objects "
      "take {% set a.b = ... %}");
}

/* The template's sets never reach the caller's context. */
static void test_context_unchanged(void **state) {
  (void)state;
  json_t *ctx = json_loads(kContext, 0, NULL);
  char *before = json_dumps(ctx, JSON_SORT_KEYS), *out = NULL, err[256];
  tmpl_t *t;
  assert_int_equal(tmpl_parse("{% set messages = [] %}{% set ns = namespace(m=messages) %}"
                              "{% set ns.m = 1 %}{% set xs = xs + [9] %}{{ xs }}",
                              &t, err, sizeof err),
                   0);
  assert_int_equal(tmpl_render(t, ctx, &out, err, sizeof err), 0);
  assert_string_equal(out, "[3, 1, 2, 9]");
  char *after = json_dumps(ctx, JSON_SORT_KEYS);
  assert_string_equal(before, after);
  free(before);
  free(after);
  free(out);
  tmpl_free(t);
  tmpl_free(NULL);
  json_t *list = json_array();
  assert_int_equal(tmpl_parse("x", &t, err, sizeof err), 0);
  assert_int_equal(tmpl_render(t, list, &out, err, sizeof err), TY_EINVAL);
  assert_null(out);
  assert_string_equal(err, "chat template context must be a JSON object, not another value");
  tmpl_free(t);
  json_decref(list);
  json_decref(ctx);
}

static void test_raise_exception(void **state) {
  (void)state;
  assert_fails(
      "ok\n{% if messages|length > 1 %}{{ raise_exception('Too many: ' ~ messages|length) }}{% "
      "endif %}",
      TY_EINVAL, "chat template line 2: Too many: 3");
  assert_fails(
      tmpl_builtin("mistral"), TY_EINVAL,
      "chat template line 1: Conversation roles must alternate user/assistant/user/assistant/...");
}

/* Each construct outside the subset is refused when parsed, by name and line. */
static void test_refusals(void **state) {
  (void)state;
  assert_fails("a\n\n{{ s|wordcount }}", TY_EINVAL,
               "chat template line 3: filter 'wordcount' is not supported");
  assert_fails("{% macro m(x) %}{{ x }}{% endmacro %}", TY_EINVAL,
               "chat template line 1: statement 'macro' is not supported");
  assert_fails("x\n{% include 'other.jinja' %}", TY_EINVAL,
               "chat template line 2: statement 'include' is not supported");
  assert_fails("{% import 'm' as m %}", TY_EINVAL,
               "chat template line 1: statement 'import' is not supported");
  assert_fails("{% from 'm' import x %}", TY_EINVAL,
               "chat template line 1: statement 'from' is not supported");
  assert_fails("{% extends 'base' %}", TY_EINVAL,
               "chat template line 1: statement 'extends' is not supported");
  assert_fails("{% block b %}{% endblock %}", TY_EINVAL,
               "chat template line 1: statement 'block' is not supported");
  assert_fails("{% call m() %}{% endcall %}", TY_EINVAL,
               "chat template line 1: statement 'call' is not supported");
  assert_fails("{% filter upper %}x{% endfilter %}", TY_EINVAL,
               "chat template line 1: statement 'filter' is not supported");
  assert_fails("{% raw %}{{ x }}{% endraw %}", TY_EINVAL,
               "chat template line 1: statement 'raw' is not supported");
  assert_fails("{% with a = 1 %}{% endwith %}", TY_EINVAL,
               "chat template line 1: statement 'with' is not supported");
  assert_fails("{% do xs.append(1) %}", TY_EINVAL,
               "chat template line 1: statement 'do' is not supported");
  assert_fails("{{ x is callable }}", TY_EINVAL,
               "chat template line 1: test 'callable' is not supported");
  assert_fails("{{ '{}'.format(1) }}", TY_EINVAL,
               "chat template line 1: method 'format' is not supported");
  assert_fails("{{ xs.append(1) }}", TY_EINVAL,
               "chat template line 1: method 'append' is not supported");
  assert_fails("{{ cycler(1, 2) }}", TY_EINVAL,
               "chat template line 1: function 'cycler' is not supported");
  assert_fails("{% for x in xs recursive %}{% endfor %}", TY_EINVAL,
               "chat template line 1: recursive loops are not supported");
  assert_fails("{% set a, b = 1, 2 %}", TY_EINVAL,
               "chat template line 1: {% set %} of several names is not supported");
  assert_fails("{{ xs|select('callable')|list }}", TY_EINVAL,
               "chat template line 1: test 'callable' is not supported");
  assert_fails("{{ xs|map('wordcount')|list }}", TY_EINVAL,
               "chat template line 1: filter 'wordcount' is not supported");
  /* and malformed templates */
  assert_fails("{% if true %}\nno end", TY_EINVAL,
               "chat template line 1: {% if %} is never closed (expected {% endif %})");
  assert_fails("{% for x in xs %}", TY_EINVAL,
               "chat template line 1: {% for %} is never closed (expected {% endfor %})");
  assert_fails("a\n{% endfor %}", TY_EINVAL,
               "chat template line 2: {% endfor %} without its opening statement");
  assert_fails("{% break %}", TY_EINVAL, "chat template line 1: {% break %} outside a loop");
  assert_fails("{{ 'open }}", TY_EINVAL, "chat template line 1: unterminated string");
  assert_fails("{{ '\\q' }}", TY_EINVAL, "chat template line 1: unknown escape \\q in a string");
  assert_fails("{# never closed", TY_EINVAL, "chat template line 1: comment {# never closed");
  assert_fails("{{ 1 + }}", TY_EINVAL, "chat template line 1: unexpected '}}' in an expression");
  assert_fails("{{ x ; }}", TY_EINVAL, "chat template line 1: unexpected character ';'");
  assert_fails("{{ xs|trim(1, 2) }}", TY_EINVAL,
               "chat template line 1: filter 'trim' takes 0 to 1 arguments, given 2");
  assert_fails("{{ range() }}", TY_EINVAL,
               "chat template line 1: function 'range' takes 1 to 3 arguments, given 0");
}

/* Hostile templates end with an error, not a hang or a crash. */
static void test_limits(void **state) {
  (void)state;
  failure(
      "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(10) %}"
      "{% endfor %}{% endfor %}{% endfor %}",
      TY_EEXHAUSTED);
  assert_fails("{{ range(2000000)|length }}", TY_EEXHAUSTED,
               "chat template line 1: range of 2000000 numbers, more than the 1000000 allowed");
  failure("{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}", TY_EEXHAUSTED);
  failure("{% set s = 'xx' %}{% for i in range(64) %}{% set s = s ~ s %}{% endfor %}",
          TY_EEXHAUSTED);
  failure("{{ 'x' * 9223372036854775807 }}", TY_EEXHAUSTED);
  /* work that makes nothing is counted too: comparisons, scans */
  failure(
      "{% set l = range(100000) %}{% for i in range(1000) %}{% if l == l %}{% endif %}{% endfor %}",
      TY_EEXHAUSTED);
  failure(
      "{% set l = range(100000) %}{% for i in range(100000) %}{% if -1 in l %}{% endif %}{% endfor "
      "%}",
      TY_EEXHAUSTED);
  failure("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s|length }}{% endfor %}",
          TY_EEXHAUSTED);
  assert_fails("{% for i in range(2000) %}{% set ns = namespace(i=i) %}{% endfor %}", TY_EEXHAUSTED,
               "chat template line 1: more than 1000 namespace() objects in one render");
  /* a namespace that holds itself is freed (the sanitizer build checks) */
  assert_render("{% set ns = namespace(a=1) %}{% set ns.me = [ns, {'n': ns}] %}{{ ns.me|length }}",
                "2");
  /* nesting: brackets, a long chain of operators, of filters, of ifs */
  char *deep = malloc(200000);
  size_t n = 0;
  n += (size_t)sprintf(deep + n, "{{ ");
  for (int i = 0; i < 5000; i++) deep[n++] = '(';
  n += (size_t)sprintf(deep + n, "1");
  for (int i = 0; i < 5000; i++) deep[n++] = ')';
  strcpy(deep + n, " }}");
  assert_fails(deep, TY_EINVAL, "chat template line 1: nesting deeper than 500");
  n = (size_t)sprintf(deep, "{{ 1");
  for (int i = 0; i < 20000; i++) n += (size_t)sprintf(deep + n, "+1");
  strcpy(deep + n, " }}");
  assert_fails(deep, TY_EINVAL, "chat template line 1: nesting deeper than 500");
  n = (size_t)sprintf(deep, "{{ 'x'");
  for (int i = 0; i < 20000; i++) n += (size_t)sprintf(deep + n, "|trim");
  strcpy(deep + n, " }}");
  assert_fails(deep, TY_EINVAL, "chat template line 1: nesting deeper than 500");
  n = 0;
  for (int i = 0; i < 2000; i++) n += (size_t)sprintf(deep + n, "{%% if true %%}");
  deep[n] = 0;
  assert_fails(deep, TY_EINVAL, "chat template line 1: nesting deeper than 500");
  n = (size_t)sprintf(deep, "{%% if false %%}");
  for (int i = 0; i < 2000; i++) n += (size_t)sprintf(deep + n, "{%% elif false %%}");
  strcpy(deep + n, "{% endif %}");
  assert_fails(deep, TY_EINVAL, "chat template line 1: nesting deeper than 500");
  /* a chain just inside the limit renders */
  n = (size_t)sprintf(deep, "{{ 0");
  for (int i = 0; i < 100; i++) n += (size_t)sprintf(deep + n, "+1");
  strcpy(deep + n, " }}");
  assert_string_equal(render(deep), "100");
  free(deep);
  char *big = malloc(TMPL_MAX_SOURCE + 2);
  memset(big, 'a', TMPL_MAX_SOURCE + 1);
  big[TMPL_MAX_SOURCE + 1] = 0;
  assert_fails(big, TY_EINVAL, "chat template of 1048577 bytes, more than the 1048576 allowed");
  free(big);
}

static const char *kLlama31Tools =
    "{\"bos_token\": \"<|begin_of_text|>\", \"add_generation_prompt\": true,"
    " \"builtin_tools\": [\"brave_search\", \"code_interpreter\", \"wolfram_alpha\"],"
    " \"messages\": [{\"role\": \"system\", \"content\": \"You can search. \"},"
    "  {\"role\": \"user\", \"content\": \"Search for trainyard\"},"
    "  {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\","
    "    \"function\": {\"name\": \"brave_search\", \"arguments\": {\"query\": \"trainyard\"}}}]},"
    "  {\"role\": \"ipython\", \"content\": [{\"title\": \"trainyard\"}]}]}";

/* Llama 3.1 with built-in tools (reject, items, tojson of a list): the text
 * Meta's prompt format documents. */
static void test_llama31_builtin_tools(void **state) {
  (void)state;
  char path[4096], err[512], *out = NULL;
  const char *srcdir = getenv("TRAINYARD_SRC_DIR");
  snprintf(path, sizeof path, "%s/tests/chat/templates/llama3.1.jinja", srcdir ? srcdir : ".");
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char src[65536];
  src[fread(src, 1, sizeof src - 1, f)] = 0;
  fclose(f);
  tmpl_t *t;
  assert_int_equal(tmpl_parse(src, &t, err, sizeof err), 0);
  json_t *ctx = json_loads(kLlama31Tools, 0, NULL);
  assert_int_equal(tmpl_render(t, ctx, &out, err, sizeof err), 0);
  assert_string_equal(out,
                      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                      "Environment: ipython\nTools: brave_search, wolfram_alpha\n\n"
                      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                      "You can search.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nSearch for trainyard<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n"
                      "<|python_tag|>brave_search.call(query=\"trainyard\")<|eom_id|>"
                      "<|start_header_id|>ipython<|end_header_id|>\n\n"
                      "[{\"title\": \"trainyard\"}]<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  free(out);
  tmpl_free(t);
  json_decref(ctx);
}

static void test_builtins(void **state) {
  (void)state;
  const char *names[] = {"llama3", "llama2", "chatml", "mistral"};
  for (size_t i = 0; i < 4; i++) {
    const char *src = tmpl_builtin(names[i]);
    assert_non_null(src);
    tmpl_t *t;
    char err[256];
    assert_int_equal(tmpl_parse(src, &t, err, sizeof err), 0);
    tmpl_free(t);
  }
  assert_null(tmpl_builtin("gpt2"));
  assert_null(tmpl_builtin(NULL));
  json_t *ctx = json_loads(
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"messages\": ["
      "{\"role\": \"system\", \"content\": \"Be brief.\"},"
      "{\"role\": \"user\", \"content\": \" Hi \"},"
      "{\"role\": \"assistant\", \"content\": \"Hello\"}]}",
      0, NULL);
  tmpl_t *t;
  char err[256], *out;
  assert_int_equal(tmpl_parse(tmpl_builtin("llama2"), &t, err, sizeof err), 0);
  assert_int_equal(tmpl_render(t, ctx, &out, err, sizeof err), 0);
  assert_string_equal(out, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello </s>");
  free(out);
  tmpl_free(t);
  json_object_set_new(ctx, "add_generation_prompt", json_true());
  assert_int_equal(tmpl_parse(tmpl_builtin("chatml"), &t, err, sizeof err), 0);
  assert_int_equal(tmpl_render(t, ctx, &out, err, sizeof err), 0);
  assert_string_equal(out,
                      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
                      "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>assistant\n");
  free(out);
  tmpl_free(t);
  json_decref(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_and_whitespace),
      cmocka_unit_test(test_literals_and_output),
      cmocka_unit_test(test_arithmetic),
      cmocka_unit_test(test_comparisons_and_logic),
      cmocka_unit_test(test_access_and_slices),
      cmocka_unit_test(test_tests),
      cmocka_unit_test(test_filters),
      cmocka_unit_test(test_methods),
      cmocka_unit_test(test_statements),
      cmocka_unit_test(test_context_unchanged),
      cmocka_unit_test(test_raise_exception),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_llama31_builtin_tools),
      cmocka_unit_test(test_builtins),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  render("");
  return rc;
}
