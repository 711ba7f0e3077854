"""Hub references and the choice of files (modeld.pull.names: pure, no network)."""

from __future__ import annotations

import pytest

from modeld.pull.names import (
    BadReference,
    HubRef,
    choose,
    choose_projector,
    is_model_file,
    is_projector_file,
    model_base,
    parse,
    parse_or_none,
    quant_of,
)


@pytest.mark.parametrize(
    ("text", "repo", "quant", "filename"),
    [
        ("hf.co/org/repo", "org/repo", None, None),
        ("hf.co/org/repo:Q4_K_M", "org/repo", "Q4_K_M", None),
        ("huggingface.co/org/repo:q8_0", "org/repo", "q8_0", None),
        ("https://huggingface.co/org/repo", "org/repo", None, None),
        ("org/repo:IQ4_XS", "org/repo", "IQ4_XS", None),
        ("org/repo@q4_k_m", "org/repo", "q4_k_m", None),
        ("hf.co/org/repo:latest", "org/repo", None, None),
        ("hf.co/org/repo/sub/m-Q8_0.gguf", "org/repo", None, "sub/m-Q8_0.gguf"),
        ("https://huggingface.co/org/repo/resolve/main/m.gguf", "org/repo", None, "m.gguf"),
        ("https://huggingface.co/org/repo/blob/main/a/m.gguf", "org/repo", None, "a/m.gguf"),
    ],
)
def test_parse_accepts_the_forms_peers_use(text: str, repo: str, quant: str | None,
                                           filename: str | None) -> None:
    ref = parse(text, strict=True)
    assert (ref.repo_id, ref.quant, ref.filename) == (repo, quant, filename)


def test_strict_parse_leaves_local_paths_alone() -> None:
    # run/load/registry: without hf.co/ or a :QUANT these are relative paths, not hub names
    for text in ("models/m.gguf", "org/repo", "org/repo/m.gguf", "./x:y", "qwen", "/abs/p:Q4"):
        assert parse_or_none(text, strict=True) is None, text
    assert parse("org/repo", strict=False) == HubRef("org/repo")  # `modeld pull org/repo`
    assert parse("org/repo/m.gguf", strict=False).filename == "m.gguf"
    with pytest.raises(BadReference):
        parse("https://evil.example/org/repo:Q4_K_M")  # other hosts are never fetched
    with pytest.raises(BadReference):
        parse("llama3.2")


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
        ("gemma-3-270m-it-BF16.gguf", "BF16"),
        ("model.f16.gguf", "F16"),
        ("m-IQ4_XS-00001-of-00002.gguf", "IQ4_XS"),
        ("Q5_K_M/m-00001-of-00003.gguf", "Q5_K_M"),
        ("m-UD-Q4_K_XL.gguf", "Q4_K_XL"),
        ("qwen2-plain.gguf", None),
    ],
)
def test_quant_of_reads_the_tag(name: str, quant: str | None) -> None:
    assert quant_of(name) == quant


LISTED = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "m-F16.gguf", "mmproj-m-F16.gguf",
          "Q6_K/m-Q6_K-00001-of-00002.gguf", "Q6_K/m-Q6_K-00002-of-00002.gguf"]  # fmt: skip


def test_choose_default_asked_shards_and_file() -> None:
    c = choose(HubRef("o/r"), LISTED)
    assert (c.files, c.quant, c.reason) == (("m-Q4_K_M.gguf",), "Q4_K_M", "default")
    c = choose(HubRef("o/r", quant="q8_0"), LISTED)
    assert (c.files, c.quant, c.reason) == (("m-Q8_0.gguf",), "Q8_0", "asked")
    c = choose(HubRef("o/r", quant="Q6_K"), LISTED)
    assert c.files == ("Q6_K/m-Q6_K-00001-of-00002.gguf", "Q6_K/m-Q6_K-00002-of-00002.gguf")
    c = choose(HubRef("o/r", filename="m-F16.gguf"), LISTED)
    assert (c.files, c.reason) == (("m-F16.gguf",), "file")


def test_choose_falls_back_to_the_best_listed_and_never_swaps_an_asked_quant() -> None:
    c = choose(HubRef("o/r"), ["m-F16.gguf", "m-Q8_0.gguf", "m-Q3_K_M.gguf"])
    assert (c.files, c.quant, c.reason) == (("m-Q8_0.gguf",), "Q8_0", "fallback")
    with pytest.raises(KeyError, match=r"no Q2_K file \(it has: F16, Q4_K_M, Q6_K, Q8_0\)"):
        choose(HubRef("o/r", quant="Q2_K"), LISTED)
    with pytest.raises(KeyError, match="missing shards"):
        choose(HubRef("o/r", quant="Q6_K"), LISTED[:-1])
    with pytest.raises(KeyError, match=r"no \.gguf model files"):
        choose(HubRef("o/r"), ["README.md", "mmproj-F16.gguf"])


def test_the_repositorys_image_projector_is_chosen_with_the_model() -> None:
    assert choose(HubRef("o/r"), LISTED).projector == "mmproj-m-F16.gguf"
    assert choose(HubRef("o/r"), LISTED[:4]).projector is None  # a text-only repository
    # the model's own precision first, else F16 before BF16, Q8_0 and F32
    unsloth = ["g-Q4_K_M.gguf", "g-BF16.gguf", "mmproj-BF16.gguf", "mmproj-F32.gguf",
               "mmproj-F16.gguf"]  # fmt: skip
    assert choose(HubRef("o/r"), unsloth).projector == "mmproj-F16.gguf"
    assert choose(HubRef("o/r", quant="bf16"), unsloth).projector == "mmproj-BF16.gguf"
    assert choose_projector("g-Q4_K_M.gguf", ["mmproj-Q4_0.gguf", "mmproj-a.gguf"]) == \
        "mmproj-Q4_0.gguf"  # none preferred: the first by name
    # a repository of several models: the projector named after the model, in its folder
    many = ["4b/gemma-3-4b-it-Q4_K_M.gguf", "12b/gemma-3-12b-it-Q4_K_M.gguf",
            "4b/mmproj-gemma-3-4b-it-f16.gguf", "12b/mmproj-gemma-3-12b-it-f16.gguf",
            "mmproj-gemma-3-12b-it-f16.gguf"]  # fmt: skip
    assert choose(HubRef("o/r", filename="12b/gemma-3-12b-it-Q4_K_M.gguf"), many).projector \
        == "12b/mmproj-gemma-3-12b-it-f16.gguf"
    flat = ["gemma-3-4b-it-Q4_K_M.gguf", "gemma-3-12b-it-Q4_K_M.gguf",
            "mmproj-gemma-3-12b-it-f16.gguf", "mmproj-gemma-3-4b-it-f16.gguf"]  # fmt: skip
    assert choose(HubRef("o/r", filename="gemma-3-4b-it-Q4_K_M.gguf"), flat).projector == \
        "mmproj-gemma-3-4b-it-f16.gguf"
    # pulling a projector by its own name fetches it alone
    c = choose(HubRef("o/r", filename="mmproj-m-F16.gguf"), LISTED)
    assert (c.files, c.projector) == (("mmproj-m-F16.gguf",), None)
    assert model_base("Q8_0/gemma-3-4b-it-Q8_0.gguf") == "gemma-3-4b-it"
    assert (is_projector_file("o/MMPROJ-x.gguf"), is_model_file("o/MMPROJ-x.gguf")) == \
        (True, False)
