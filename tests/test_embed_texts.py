"""beam_jax.text.EmbedTexts through real pipelines: strings or (id, text) pairs to vectors."""

from __future__ import annotations

import json
import pathlib

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
import beam_jax.text
from beam_jax.text import EmbedTexts

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def reference():
    texts = json.loads((FIXTURES / "minilm_reference.json").read_text(encoding="utf-8"))["texts"]
    with np.load(FIXTURES / "minilm_reference.npz", allow_pickle=False) as npz:
        return texts[:12], npz["embeddings"][:12]


def _cosine(a, b) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _check_vectors(expected: dict):
    """assert_that's matcher: one (id, vector) per expected id, each like its reference."""

    def check(got):
        ids = [key for key, _ in got]
        assert sorted(ids, key=repr) == sorted(expected, key=repr), ids
        for key, vector in got:
            assert vector.dtype == np.float32 and vector.shape == (384,)
            assert _cosine(vector, expected[key]) >= 0.9999, key

    return check


def test_strings_give_one_vector_or_one_dead_letter_each(reference):
    texts, embeddings = reference
    elements = [*texts, None, 42]
    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        vectors, failed = (
            p | beam.Create(elements) | EmbedTexts(max_batch_size=5).with_exception_handling()
        )
        assert_that(vectors, _check_vectors(dict(zip(texts, embeddings, strict=True))))
        assert_that(
            failed | beam.Map(lambda r: (r.key, r.stage, r.error_type)),
            equal_to(
                [
                    (None, "validation", "InvalidElementError"),
                    (42, "validation", "InvalidElementError"),
                ]
            ),
            label="dead",
        )


def test_pairs_keep_their_ids_of_any_type(reference):
    texts, embeddings = reference
    ids = [i if i % 3 else (f"doc-{i}", i) for i in range(len(texts))]
    ids[1] = "a string id"
    elements = [*zip(ids, texts, strict=True), ("null", None), (b"raw", 3.5)]
    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        vectors, failed = (
            p | beam.Create(elements) | EmbedTexts(max_batch_size=4).with_exception_handling()
        )
        assert_that(vectors, _check_vectors(dict(zip(ids, embeddings, strict=True))))
        assert_that(
            failed | beam.Map(lambda r: (r.key, r.key_type, r.stage, r.element)),
            equal_to([("null", None, "validation", "None"), ("raw", "bytes", "validation", "3.5")]),
            label="dead",
        )


def test_a_text_the_tokenizer_refuses_is_a_dead_letter_keyed_by_its_id():
    # Past the tokenized prefix, with too few tokens in it (see TextTooLongError).
    long_text = "word" + " " * bj.text.MAX_TOKENIZED_CHARS + "word"
    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        vectors, failed = (
            p
            | beam.Create([(("t", 1), long_text), (("t", 2), "short")])
            | EmbedTexts().with_exception_handling()
        )
        assert_that(vectors | beam.Map(lambda kv: kv[0]), equal_to([("t", 2)]))
        assert_that(
            failed | beam.Map(lambda r: (r.key, r.stage, r.error_type)),
            equal_to([(("t", 1), "tokenize", "TextTooLongError")]),
            label="dead",
        )


def test_without_exception_handling_a_bad_element_fails_the_pipeline_and_says_how_to_keep_going():
    with pytest.raises(Exception, match=r"id 7 .*with_exception_handling\(\)"):
        with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
            _ = p | beam.Create([(7, None), (8, "fine")]) | EmbedTexts()


def test_without_exception_handling_the_output_is_the_vectors():
    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        vectors = p | beam.Create(["one", "two"]) | EmbedTexts()
        assert_that(
            vectors | beam.Map(lambda kv: (kv[0], len(kv[1]))),
            equal_to([("one", 384), ("two", 384)]),
        )


def test_a_bad_configuration_is_refused():
    with pytest.raises(bj.SpecError, match="max_batch_size must be a positive int"):
        EmbedTexts(max_batch_size=0)
    with pytest.raises(bj.SpecError, match="batching must be"):
        EmbedTexts(batching="packed")


def test_a_text_that_is_no_string_is_told_how_to_become_one():
    elements = ["fine", b"caf\xc3\xa9", None, ("pair", None), 42]
    with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
        _, failed = p | beam.Create(elements) | EmbedTexts().with_exception_handling()
        takes = "EmbedTexts takes strings or (id, text) pairs of a string."
        assert_that(
            failed | beam.Map(lambda r: (r.key, r.message)),
            equal_to(
                [
                    (
                        "café",  # a bytes key, as a dead letter holds it (key_type "bytes")
                        f"the text is bytes; {takes} Decode it first (text.decode('utf-8'), "
                        "or the text's own encoding) or drop it",
                    ),
                    (None, f"the text is None; {takes} Give the element a text or drop it"),
                    ("pair", f"the text is None; {takes} Give the element a text or drop it"),
                    (42, f"the text is an int; {takes} Convert it with str() first or drop it"),
                ]
            ),
        )
