"""The public surface: what pipeline authors import, what power users reach one level down."""

import ast
import dataclasses
import importlib
import pathlib
import re
import typing

import pytest

import beam_jax as bj
import beam_jax.internal as internal
import beam_jax.jobs as jobs
import beam_jax.runners as runners
import beam_jax.testing
import beam_jax.text as text
import beam_jax.yaml
from beam_jax._src.engine.options import KernelOptions, KernelOptionsKwargs

TOP_LEVEL = {
    # transforms and their results
    "RunKernel",
    "RunKernelOnArrow",
    "ReduceKernel",
    "Reduction",
    "RunKernelResult",
    "ReadArrowBatches",
    "WorkAhead",
    # Beam ML front ends
    "FailedInferences",
    "JaxModelHandler",
    "KeyedJaxModelHandler",
    # configuration
    "ArraySpec",
    "Bucketing",
    "Validation",
    "KernelOptions",
    "ArrowColumns",
    "FitToMemory",
    "CrossBundle",
    "default_boundaries",
    "plan_boundaries",
    "plan_bucketing",
    "BucketingChoice",
    "Packing",
    "plan_packing",
    "PackingChoice",
    # inside a kernel
    "length_mask",
    "BatchLengths",
    # parameters
    "read_params",
    "write_params",
    # dead letters and metrics
    "FailedElement",
    "DEAD_LETTERS",
    "Stage",
    "Summary",
    "summarize",
    "metric_totals",
    "BufferingSummary",
    # errors
    "BeamJaxError",
    "SpecError",
    "InputFileError",
    "InputLineError",
    "InvalidElementError",
    "ElementTooLargeError",
    "KernelError",
    "CompileError",
    "DeadLetterThresholdError",
    "DeviceUnavailableError",
    "InferenceBatchError",
}

INTERNAL = {
    "ROW_COLUMN",
    "bad_lines_of",
    "row_origin",
    "Plan",
    "PaddedBatch",
    "Validated",
    "Kernel",
    "Worker",
    "BatchEngine",
    "Buffer",
    "FrontEnd",
    "origin_of",
    "with_origin",
    "padding_ratio",
    "bucket_totals",
    "fit_plan",
    # writing a front end of one's own (tests/test_custom_front_end.py)
    "RowBuffer",
    "check_row_outputs",
    "check_summed_outputs",
    "ElementFrontEnd",
    "Outputs",
    "PerElement",
    "WorkerDoFn",
    "Source",
    "dead_letter_output",
    "Packer",
    "KernelMetrics",
}


TEXT = {
    # the model, described once
    "SentenceEncoder",
    "EmbedText",
    "EmbedTexts",
    "EmbedBatches",
    "TokenizeBatches",
    "IdType",
    "unicode_problem",
    "INPUT_IDS",
    "TOKENIZE",
    "default_tokenize_threads",
    "plan_batching",
    "BatchingChoice",
    "BertConfig",
    "MODEL_TYPES",
    "Tokenizer",
    "TextTooLongError",
    "ModelFileMismatchError",
    # its directory and the packaged default
    "ModelDir",
    "read_model_dir",
    "packaged_model_dir",
    "local_model_dir",
    "verify_model_dir",
    "make_manifest",
    "MINILM_MANIFEST",
    # the forward pass, for kernels of one's own
    "embed",
    "embed_packed",
    "encode_tokens",
    "segment_attention_bias",
    "read_weights",
    "MATMULS",
    "LAYER_KERNELS",
    "MAX_TOKENIZED_CHARS",
    # text to try them on
    "builtin_corpus",
    "labelled_corpus",
}


JOBS = {
    "on_accelerator",
    "accelerator_workers",
    "run_dry",
    "embeddings_schema",
    "embeddings_table",
    "gather_in_row_order",
    "vectors_of",
    "write_embeddings",
    "RowCount",
    "column_types",
    "sample_texts",
    "counted",
    "devices_per_worker",
    "single_worker_here",
    "workers_here",
    "InputFile",
    "id_type_of",
    "input_format",
    "match_inputs",
    "text_sample",
    "values_type",
    "local_platform",
    "open_local_devices",
    "DefaultsHelpFormatter",
    "add_compilation_cache_flag",
    "int_list",
    "non_negative",
    "parse_job_args",
    "positive_int",
    "ratio",
    "OutputDir",
    "OutputLayout",
    "OutputExistsError",
    "write_atomically",
    "open_atomically",
    "CountProgress",
    "ProgressPrinter",
    "read_counts",
    "RunConsole",
    "add_flags",
    "failure_line",
    "is_local",
    "prog",
    "run_main",
    "dead_letter_json",
    "read_dead_letters",
    "WriteDeadLetters",
    "dataflow_job_description",
    "is_dry_run",
    "write_dataflow_job_file",
    # one Beam version for a job and its workers' image
    "WORKER_IMAGE_BEAM",
    "metrics_record",
    "write_metrics",
    "freeze_startup_objects",
    "prompt_bundle_ends",
}


RUNNERS = {"DaskRunner", "DaskJobResult", "UnsupportedOnDaskError"}


YAML = {"ReadRowsWithOrigin", "RunKernelOnRows", "OriginFields", "YamlErrors", "error_output"}

TESTING = {"assert_conserved", "Collected", "CountingLoader", "StreamTest", "VirtualClock"}

FACES = {
    bj: TOP_LEVEL,
    internal: INTERNAL,
    text: TEXT,
    jobs: JOBS,
    runners: RUNNERS,
    beam_jax.yaml: YAML,
    beam_jax.testing: TESTING,
}


def _public(module) -> set[str]:
    faces = {"internal", "testing", "text", "jobs", "runners", "yaml"}
    return {n for n in dir(module) if not n.startswith("_")} - faces


def test_implementation_modules_are_private():
    """Besides the faces (and ``python -m beam_jax``), every module is under _src/."""
    root = pathlib.Path(bj.__file__).parent
    faces = {p.name for p in root.iterdir() if not p.name.startswith("_")} - {"py.typed"}
    assert faces == {
        "internal.py",
        "testing.py",
        "text.py",
        "jobs.py",
        "runners.py",
        "yaml.py",
    }, faces
    for face in FACES.keys() - {beam_jax.testing}:  # testing defines its few helpers itself
        for name in _public(face):
            obj = getattr(face, name)
            module = getattr(obj, "__module__", None) if callable(obj) else None
            if module is not None:  # constants (DEAD_LETTERS, MINILM_MANIFEST) have none
                assert module.startswith("beam_jax._src."), (face.__name__, name, module)


def test_top_level_exports_exactly_what_pipeline_authors_use():
    assert _public(bj) == TOP_LEVEL


def test_internal_exports_the_machinery():
    assert _public(internal) == INTERNAL
    assert not TOP_LEVEL & INTERNAL, "a name lives in one place"


def test_text_exports_the_sentence_encoder():
    assert _public(text) == TEXT
    assert not (TOP_LEVEL | INTERNAL) & TEXT, "a name lives in one place"
    for name in TEXT:
        obj = getattr(text, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, bj.BeamJaxError), name
            assert obj.__doc__ and len(obj.__doc__.strip().splitlines()) >= 2, name


def test_jobs_exports_what_a_runnable_job_wraps_around_its_pipeline():
    assert _public(jobs) == JOBS
    assert not JOBS & (TOP_LEVEL | INTERNAL | TEXT), "a name lives in one place"
    assert issubclass(jobs.OutputExistsError, bj.BeamJaxError)


def test_runners_exports_the_dask_runner():
    assert _public(runners) == RUNNERS
    assert not RUNNERS & (TOP_LEVEL | INTERNAL | TEXT | JOBS), "a name lives in one place"
    assert issubclass(runners.UnsupportedOnDaskError, bj.SpecError)
    from apache_beam.runners.dask.dask_runner import DaskRunner

    assert issubclass(runners.DaskRunner, DaskRunner)


def test_yaml_exports_what_beam_yaml_pipelines_use():
    assert _public(beam_jax.yaml) == YAML
    listing = (
        pathlib.Path(bj.__file__).parents[1] / "pipelines" / "beam_jax_provider.yaml"
    ).read_text()
    named = set(re.findall(r'"(beam_jax[.\w]*)"', listing))
    assert {f"beam_jax.yaml.{n}" for n in ("ReadRowsWithOrigin", "RunKernelOnRows")} <= named
    for path in named:  # every name the provider listing gives is public and importable
        module, _, name = path.rpartition(".")
        assert name in importlib.import_module(module).__all__, path


def test_every_face_declares_all_and_each_name_lives_in_one_face():
    seen: dict[str, str] = {}
    for face, names in FACES.items():
        assert sorted(face.__all__) == sorted(set(face.__all__)), face.__name__
        assert set(face.__all__) == names, face.__name__
        if face is not beam_jax.testing:  # a module of its own code, not only re-exports
            assert _public(face) == names, face.__name__
        for name in face.__all__:
            assert name not in seen, f"{name} is in {seen.get(name)} and {face.__name__}"
            seen[name] = face.__name__


@pytest.mark.parametrize(
    ("module", "former", "now"),
    [(bj, "PackingPlan", "PackingChoice"), (bj, "BucketingPlan", "BucketingChoice"),
     (internal, "PackPlan", "Packer")],
)  # fmt: skip
def test_a_former_name_still_imports_with_a_warning_naming_the_new_one(module, former, now):
    with pytest.warns(DeprecationWarning, match=f"{former} is now {module.__name__}.{now}"):
        assert getattr(module, former) is getattr(module, now)
    assert former not in module.__all__ and former not in dir(module)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        module.NoSuchName  # noqa: B018


def test_every_error_is_a_beam_jax_error_and_says_how_to_fix_it():
    for name in TOP_LEVEL:
        obj = getattr(bj, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, bj.BeamJaxError), name
            assert obj.__doc__ and len(obj.__doc__.strip().splitlines()) >= 2, name


def test_stages_and_the_dead_letter_tag_are_exported():
    assert bj.DEAD_LETTERS == "dead_letters"
    assert bj.Stage.ALL == ("validation", "compile", "kernel", "output")


def test_kernel_options_are_stated_once_and_the_kwargs_type_matches():
    fields = {f.name: f.type for f in dataclasses.fields(KernelOptions)}
    hints = typing.get_type_hints(KernelOptionsKwargs)
    assert set(hints) == set(fields)
    resolved = typing.get_type_hints(KernelOptions)
    for name in fields:
        # The kwargs may drop "| None" where the dataclass accepts None as "the default".
        assert str(hints[name]).replace(" | None", "") in str(resolved[name]), name


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _module_graph() -> dict[str, set[str]]:
    """``beam_jax``'s modules and the ``beam_jax`` modules each imports (lazily or not)."""
    root = pathlib.Path(bj.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    } | {"__paths__": modules}  # type: ignore[dict-item]


def test_imports_only_go_down_the_layers():
    """compat < bucketing < core, runners < arrow, kernel, text < engine < transforms <
    inference, jobs < cli: a module imports only from its own layer and those below (lazy
    imports included). The runner adapters use no other layer; the transforms ask them what
    a runner lacks."""
    rank = {"compat": -1, "bucketing": 0, "core": 1, "runners": 1, "arrow": 2, "kernel": 2,
            "text": 2, "engine": 3, "transforms": 4, "inference": 5, "jobs": 5,
            "cli": 6}  # fmt: skip
    root = pathlib.Path(bj.__file__).parent / "_src"
    assert {p.name for p in root.iterdir() if (p / "__init__.py").exists()} == set(rank)
    for package, level in rank.items():
        for path in (root / package).glob("*.py"):
            module = importlib.import_module(f"beam_jax._src.{package}.{path.stem}")
            for imported in _imports(path):
                other = imported.split(".")[2] if imported.startswith("beam_jax._src.") else None
                if other in rank and other != package:
                    assert rank[other] < level, (module.__name__, imported)


def test_beam_jax_never_imports_pipelines():
    """The CLI reaches the flagship by registered names (entry points), never by import."""
    paths = _module_graph()["__paths__"]
    for name, path in paths.items():
        bad = {m for m in _imports(path) if m == "pipelines" or m.startswith("pipelines.")}
        assert not bad, (name, bad)


def test_the_import_graph_of_beam_jax_has_no_cycles():
    graph = _module_graph()
    del graph["__paths__"]
    # A package's own __init__ importing its submodules is not a cycle through them.
    edges = {
        name: {m for m in deps if not (name == "beam_jax" or m.startswith(name + "."))}
        for name, deps in graph.items()
    }
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(path + [node, nxt])}")
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])


def test_the_text_layer_uses_no_beam():
    """beam_jax.text's implementation runs without Beam (a notebook, a service, a test)."""
    root = pathlib.Path(bj.__file__).parent / "_src" / "text"
    for path in root.glob("*.py"):
        beam = {m for m in _imports(path) if m.split(".")[0] == "apache_beam"}
        assert not beam, (path.name, beam)


MAX_MODULE_LINES = 600  # a module past it holds two concepts: split it (the largest: ~560)


def test_no_library_module_passes_the_size_of_one_concept():
    root = pathlib.Path(bj.__file__).parent
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in root.rglob("*.py")}
    assert max(sizes.values()) <= MAX_MODULE_LINES, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
