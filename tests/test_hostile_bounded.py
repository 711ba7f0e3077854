"""Issue 45, bounded work: hostile inputs get their 400 before the heavy work, heavy work runs
where it holds no one else back and stops when its caller leaves.

Pure parts here (no daemon): the enum bound, a child build killed on cancel, the bounded JSON
parser, tool names, the template sandbox; tests/test_hostile_daemon.py tries the same against
a real daemon. No wall-clock asserts: outcomes only (the 400 and what it names, which request
finished first, a process gone).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from daemonutil import until
from modeld.daemon import grammar, grammarproc
from modeld.daemon.builds import Cancel
from modeld.errors import CancelledError, InvalidRequestError
from modeld.runner import templatebound
from modeld.runner.template import render_template
from modeld.schema.convert import constant_limits
from modeld.wire import textcheck
from modeld.wire.messages import parse_tools
from modeld.wire.protocol import ProtocolError

TEMPLATES = Path(__file__).parent / "templates"


def _words(n: int, width: int = 9) -> list[str]:
    return [f"w{i:0{width - 1}d}" for i in range(n)]


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


# ------------------------------------------------------------------ enum/const bound


def test_an_8mb_enum_is_refused_by_its_count_naming_path_limit_and_setting() -> None:
    words = _words(700_000, 11)  # ~8.4 MB of JSON, the size
    schema = {"type": "object", "properties": {"w": {"enum": words}}, "required": ["w"]}
    with pytest.raises(InvalidRequestError) as caught:
        grammar.for_request(schema, (), "auto")
    exc = caught.value
    assert "700000 enum/const values" in exc.message
    assert exc.details["schema_path"] == "#/properties/w/enum"
    assert exc.details["limit"] == constant_limits(grammar.MAX_GRAMMAR_BYTES)[0]
    assert "max_grammar_bytes" in exc.hint


def test_enum_text_past_twice_the_grammar_is_refused_before_its_tree() -> None:
    long_words = ["x" * 40 + w for w in _words(60_000)]  # 60,000 values, ~3 MB of text
    with pytest.raises(InvalidRequestError, match="bytes of enum/const text") as caught:
        grammar.for_request({"enum": long_words}, (), "auto")
    assert caught.value.details["limit"] == 2 * grammar.MAX_GRAMMAR_BYTES


def test_constants_are_counted_across_the_whole_schema_and_the_setting_raises_the_bound() -> None:
    small = 64 * 1024
    max_values = constant_limits(small)[0]
    first = _words(2_000, 5)  # its grammar fits; with the second, too many values
    second = _words(max_values - len(first) + 1, 5)
    schema = {"type": "object", "properties": {"a": {"enum": first}, "b": {"enum": second}}}
    with pytest.raises(InvalidRequestError, match="enum/const values") as caught:
        grammar.for_request(schema, (), "auto", max_bytes=small)
    assert caught.value.details["schema_path"] == "#/properties/b/enum"
    one = {"enum": _words(max_values + 1, 4)}
    with pytest.raises(InvalidRequestError, match="enum/const values"):
        grammar.for_request(one, (), "auto", max_bytes=small)
    assert grammar.for_request({"enum": _words(2000, 4)}, (), "auto", max_bytes=small)


def test_a_50000_word_enum_still_builds() -> None:
    """The size the first pass answered (a stream beside it kept its pace): not refused."""
    assert grammar.from_schema({"enum": _words(50_000)}, "format")


# ------------------------------------------------------------------ a child build cancelled


def _live() -> set[int]:
    with grammarproc._live_lock:
        return {p.pid for p in grammarproc._live}


def test_a_child_build_is_killed_when_its_caller_leaves() -> None:
    cancel = Cancel()
    schema = {"enum": _words(60_000)}  # big: built in a child, about a second or more
    outcome: list[BaseException | str | None] = []

    def build() -> None:
        try:
            outcome.append(grammarproc.for_request(schema, (), "auto", cancel=cancel))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=build)
    worker.start()
    pids = until(_live, timeout=30, what="the builder child")
    cancel.cancel()
    worker.join(60)
    assert isinstance(outcome[0], CancelledError)
    assert not _live()
    for pid in pids:  # reaped: no such process (not even a zombie)
        assert not Path(f"/proc/{pid}").exists()


def test_a_cancel_before_the_child_starts_kills_it_as_it_starts() -> None:
    cancel = Cancel()
    cancel.cancel()
    with pytest.raises(CancelledError):
        grammarproc.for_request({"enum": _words(60_000)}, (), "auto", cancel=cancel)
    assert not _live()


def test_big_is_decided_by_the_first_bytes_only() -> None:
    assert grammarproc.big({"enum": _words(700_000)}, ())
    assert not grammarproc.big({"type": "object", "properties": {"a": {"type": "string"}}}, ())


# ------------------------------------------------------------------ JSON in JSON: one depth bound


@pytest.mark.parametrize("levels", [65, 900, 1_000, 5_000, 100_000])
def test_nested_json_text_is_refused_with_the_bodys_bound_naming_the_field(levels: int) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        textcheck.parse_json(_deep(levels), "messages[0].tool_calls[0].arguments")
    details = caught.value.details
    assert details["max_depth"] == textcheck.MAX_DEPTH
    assert details["field"].startswith("messages[0].tool_calls[0].arguments")


def test_json_text_within_the_bound_parses() -> None:
    assert textcheck.parse_json(_deep(textcheck.MAX_DEPTH), "x") == \
        json.loads(_deep(textcheck.MAX_DEPTH))
    with pytest.raises(ValueError):
        textcheck.parse_json("{nope", "x")


# ------------------------------------------------------------------ tool names


@pytest.mark.parametrize("name", ["get weather", 'x"y', "a\nb", "x" * 129, "é"])
def test_a_tool_name_outside_the_rule_is_refused_naming_the_field(name: str) -> None:
    def fail(message: str) -> Exception:
        return ProtocolError(message)

    with pytest.raises(ProtocolError, match=r"tools\[0\]\.name must be"):
        parse_tools([{"name": name}], fail)


def test_tool_names_of_every_api_pass() -> None:
    names = ["get_weather", "search-web", "mcp.server:tool", "x" * 128]
    tools = parse_tools([{"name": n} for n in names], ProtocolError)
    assert [t.name for t in tools] == names


# ------------------------------------------------------------------ chat templates


MESSAGES = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3+3?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "adds", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]


@pytest.mark.parametrize("path", sorted(TEMPLATES.glob("*.jinja")), ids=lambda p: p.stem)
def test_real_templates_render_as_llama_cpp_pythons_formatter_does(path: Path) -> None:
    template = path.read_text()
    want = Jinja2ChatFormatter(template=template, eos_token="</s>", bos_token="<s>")(
        messages=[dict(m) for m in MESSAGES], tools=TOOLS).prompt  # type: ignore[arg-type]
    got = render_template(template, MESSAGES, "<s>", "</s>", tools=TOOLS)
    assert got == want


LOOPS = ("{% for m in messages %}{% if 'hang' in m.content %}{% for i in range(100000) %}"
         "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}{{ m.content }}"
         "{% endfor %}")
DOUBLES = ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
           "{% endfor %}{{ ns.s|length }}")


def test_a_looping_template_is_stopped_and_the_next_render_is_fine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templatebound, "RENDER_CPU_S", 0.5)
    with pytest.raises(InvalidRequestError, match=r"chat template.*was stopped.*CPU time") as c:
        render_template(LOOPS, [{"role": "user", "content": "please hang"}], "", "")
    assert c.value.details == {"template": "tokenizer.chat_template"}
    assert render_template(LOOPS, [{"role": "user", "content": "hello"}], "", "") == "hello"


@pytest.mark.parametrize("template", [
    DOUBLES,
    "{% set ns = namespace(s=[1]) %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}",
    "{{ 'x' * 1000000000 }}", "{{ messages[0].content|center(1000000000) }}",
    "{{ messages[0].content.ljust(1000000000) }}", "{{ 9 ** 99999999 }}",
    "{{ '%999999999s' % 'x' }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
])
def test_a_template_that_grows_without_bound_is_stopped_before_it_allocates(
        template: str) -> None:
    with pytest.raises(InvalidRequestError, match="was stopped"):
        render_template(template, [{"role": "user", "content": "x"}], "", "")


def test_a_template_syntax_error_is_a_request_error_that_says_so() -> None:
    with pytest.raises(InvalidRequestError, match=r"has a syntax error: .*\(line 1\)"):
        render_template("{% for m in messages %}", MESSAGES, "", "")


# ------------------------------------------------------------------ tokenizing lanes


def test_a_long_prompt_is_tokenized_while_a_huge_one_still_runs() -> None:
    """Issue 45 item 6: a 12 MB count_tokens held a 36,000-character prompt behind it. The
    huge one blocks here until the long one is done: with one lane for both, it never is."""
    from modeld.runner import prepare
    from modeld.runner.prompting import PromptText
    from modeld.runner.specs import parse_generate
    from modeld.wire import runnerwire as rp

    release = threading.Event()

    def policy(spec: object) -> prepare.Prepared:
        text = spec.prompt or ""  # type: ignore[attr-defined]
        if len(text) >= prepare.HUGE_CHARS:
            assert release.wait(60), "the long prompt never got through"
        return prepare.Prepared([len(text)], PromptText(text, add_bos=True, stops=()))

    preparer = prepare.Preparer(policy)
    huge = preparer.start(parse_generate(rp.generate("h", prompt="x" * prepare.HUGE_CHARS)))
    long = preparer.start(parse_generate(rp.generate("l", prompt="y" * 36_000)))
    assert long.result(timeout=30).tokens == [36_000]
    assert not huge.done()
    release.set()
    assert huge.result(timeout=30).tokens == [prepare.HUGE_CHARS]


def test_a_big_schemas_constants_are_refused_before_a_child_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_child(*_: object) -> None:
        raise AssertionError("a child was started for a schema refused by its constants")

    monkeypatch.setattr(grammarproc, "_in_child", no_child)
    schema = {"type": "object", "properties": {"w": {"enum": _words(700_000, 11)}}}
    with pytest.raises(InvalidRequestError) as caught:
        grammarproc.for_request(schema, (), "auto")
    assert caught.value.details["schema_path"] == "#/properties/w/enum"
