"""The dataset benchmark (a user's own samples, LongBench's metrics): every metric on small
examples computed by hand, LongBench's quirks kept; the files read in each format as the suite
maps their fields; the prompt template and LongBench's middle truncation; a missing file, field
or value refused at validate naming the data and the key; and the fixture answered through
`kvbench run` (truncated and skipped samples, classification without the chat template), its
records, report and pairing with identity."""
from __future__ import annotations

import json
import statistics

import pytest

from tests.plugins.extras import require_extra

require_extra("datasets")  # the datasets library and rouge-score

from kvbench.benchmarks.measure.answering import Prompt  # noqa: E402
from kvbench.benchmarks.measure.longbench_scoring import (  # noqa: E402
    METRICS, classification, contains, exact, first_line, normalize_answer, qa_f1, rouge_l,
    sample_score,
)
from kvbench.config.fields import choices  # noqa: E402
from kvbench.data.prompt_template import LONGBENCH_QA, PromptTemplate  # noqa: E402
from kvbench.data.records import Fields, RecordsError, read_records  # noqa: E402
from kvbench.results import load_results  # noqa: E402
from kvbench.run.files import PREDICTIONS  # noqa: E402
from kvbench.suite.errors import SuiteError  # noqa: E402
from kvbench.suite.loader import load_suite  # noqa: E402
from tests.plugins.cli_support import invoke, wide_consoles  # noqa: E402,F401
from tests.plugins.hub_standin import HubStandIn, point_kvbench_at  # noqa: E402
from tests.plugins.suites import ROOT, line_of  # noqa: E402

FIXTURES = ROOT / "tests" / "data" / "dataset"
QA = FIXTURES / "qa_mini.jsonl"  # 4 rows in LongBench's layout; row 2 is long
TREC = FIXTURES / "trec_mini.jsonl"  # 3 few-shot classification rows with all_classes
LONGBENCH_FIELDS = Fields("context", "input", "answers", None)
SHIPPED = ROOT / "suites" / "dataset.yaml"


# ---------------------------------------------------------------- metrics


def test_normalize_answer_is_longbench_s():
    # lower, punctuation out, then the articles (so "the," goes too), whitespace collapsed
    assert normalize_answer("The Cat,  sat on  A mat!") == "cat sat on mat"
    assert normalize_answer("an-apple") == "anapple"  # the hyphen goes before the articles do


def test_qa_f1_by_hand():
    # "the" is dropped: 8 prediction tokens, 2 in common with the 2 of the reference
    # P = 2/8, R = 1: F1 = 2 * 0.25 / 1.25 = 0.4
    assert qa_f1("The Varn Point lighthouse was built by Hilda Moss.", "Hilda Moss") == \
        pytest.approx(0.4)
    # common tokens are a multiset: "a" is an article and goes; b b c against b b b d shares
    # b twice: P = 2/3, R = 2/4, F1 = 4/7
    assert qa_f1("a b b c", "b b b d") == pytest.approx(4 / 7)
    assert qa_f1("nothing alike", "Hilda Moss") == 0.0
    assert qa_f1("", "Hilda Moss") == 0.0


def test_rouge_l_by_hand():
    # LCS "the cat on the mat": 5 of 6 tokens on each side
    assert rouge_l("the cat sat on the mat", "The cat lay on the mat") == pytest.approx(5 / 6)
    # one token in order of two on each side: P = R = 1/2
    assert rouge_l("mat the", "the cat") == pytest.approx(0.5)
    assert rouge_l("", "the cat") == 0.0


def test_exact_and_contains_by_hand():
    assert exact("The Kittiwake.", "the kittiwake") == 1.0
    assert exact("Kittiwake ferry", "the Kittiwake") == 0.0
    assert contains("The ferry is called the Kittiwake.", "the Kittiwake") == 1.0
    assert contains("between Calder and Bray", "Ottley and Bray") == 0.0
    assert contains("concatenate", "cat") == 0.0  # whole words only


def test_classification_is_longbench_s_with_its_skip():
    classes = ["Location", "Human being", "Number"]
    assert classification("Type: Location", "Location", classes) == 1.0
    assert classification("Location or Number", "Number", classes) == 0.5  # two classes named
    assert classification("Number", "Location", classes) == 0.0
    # "Human" is part of the reference without being it: left out
    assert classification("Human being", "Human being", ["Human", "Human being"]) == 1.0
    # LongBench removes while it iterates: "New" goes, so "York" is never looked at and stays
    # beside "New York": 1/2, where a plain filter would give 1
    assert classification("New York", "New York", ["New", "York", "New York"]) == 0.5


def test_a_sample_scores_its_best_reference_on_its_first_line_if_asked():
    # "7" against "7 arches": P = 1/2, R = 1, F1 = 2/3; "seven": 0
    assert sample_score("7 arches", ["seven", "7"], "qa_f1") == pytest.approx(200 / 3)
    assert first_line("\n\nLocation\nQuestion: Who?") == "Location"
    answer = "\nLocation\nQuestion: Where is Rome?\nType: Location"
    classes = ["Location", "Number"]
    assert sample_score(answer, ["Location"], "classification", classes, True) == 100.0
    assert sample_score("Number\nLocation", ["Location"], "classification", classes) == 50.0
    with pytest.raises(TypeError):
        sample_score("x", "x", "exact")


def test_every_metric_the_benchmark_declares_is_scored():
    import typing

    from kvbench.benchmarks.specs.dataset import DatasetParams

    declared = choices(typing.get_type_hints(DatasetParams)["metric"])
    assert set(declared.values) == set(METRICS)


# ---------------------------------------------------------------- data and template


def test_the_fixture_reads_as_mapped(tmp_path):
    records = read_records(str(QA), LONGBENCH_FIELDS)
    assert [r.row for r in records] == [0, 1, 2, 3]
    assert records[0].question == "Who kept the Brill lighthouse?"
    assert records[1].answers == ("yellow",)  # one answer as a string
    assert records[2].answers == ("1861", "in 1861")
    assert records[0].classes == ()  # not read: no classification
    assert [r.row for r in read_records(str(QA), LONGBENCH_FIELDS, samples=2)] == [0, 1]
    trec = read_records(str(TREC), Fields("context", "input", "answers", "all_classes"))
    assert trec[0].classes == ("Abbreviation", "Human being", "Location", "Number")


def test_csv_parquet_and_json_read_as_the_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in QA.read_text().splitlines()]
    flat = [{"ctx": r["context"], "q": r["input"],
             "a": r["answers"] if isinstance(r["answers"], str) else r["answers"][0]}
            for r in rows]  # a CSV cell holds one answer
    fields = Fields("ctx", "q", "a", None)
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "qa.parquet")
    (tmp_path / "qa.json").write_text(json.dumps(flat))
    import csv

    with open(tmp_path / "qa.csv", "w", newline="") as out:
        writer = csv.DictWriter(out, ["ctx", "q", "a"])
        writer.writeheader()
        writer.writerows(flat)
    expected = [(r.context, r.question, r.answers[:1]) for r in read_records(str(QA),
                                                                          LONGBENCH_FIELDS)]
    for name in ("qa.parquet", "qa.json", "qa.csv"):
        got = read_records(str(tmp_path / name), fields)
        assert [(r.context, r.question, r.answers) for r in got] == expected, name


def test_bad_data_names_the_file_the_field_and_the_row(tmp_path):
    with pytest.raises(RecordsError, match="has no field 'answer' .the answers.") as missing:
        read_records(str(QA), Fields("context", "input", "answer", None))
    assert str(QA) in str(missing.value) and missing.value.role == "answers"
    holes = tmp_path / "holes.jsonl"
    holes.write_text('{"context": "c", "input": "q", "answers": ["a"]}\n'
                     '{"context": "c", "input": "q", "answers": []}\n')
    with pytest.raises(RecordsError, match=r"row 1: field 'answers' \(the answers\) is an empty"):
        read_records(str(holes), LONGBENCH_FIELDS)
    holes.write_text('{"context": "c", "input": "q", "answers": ["a"]}\n'
                     '{"input": "q", "answers": ["a"]}\n')
    with pytest.raises(RecordsError, match="row 1: no value for field 'context'"):
        read_records(str(holes), LONGBENCH_FIELDS)
    with pytest.raises(RecordsError, match="samples 9 is above the 4 rows"):
        read_records(str(QA), LONGBENCH_FIELDS, samples=9)
    with pytest.raises(RecordsError, match="'.txt' is not a format read here"):
        read_records(str(tmp_path / "qa.txt"), LONGBENCH_FIELDS)



def test_a_hub_dataset_that_is_not_there_is_named(tmp_path, monkeypatch):
    with HubStandIn() as hub:
        point_kvbench_at(hub, monkeypatch, tmp_path / "hf-cache")
        with pytest.raises(RecordsError, match="data 'hf:kvbench-no-such/dataset:test':"
                                               " dataset kvbench-no-such/dataset: no such"):
            read_records("hf:kvbench-no-such/dataset:test", LONGBENCH_FIELDS)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        with pytest.raises(RecordsError, match="not in the local Hugging Face cache"):
            read_records("hf:kvbench-no-such/dataset:test", LONGBENCH_FIELDS)


def test_the_template_is_cut_after_the_context():
    template = PromptTemplate.parse("Read {{this}}:\n{context}\nQ: {input}\nA:")
    assert template.context_text("CTX") == "Read {this}:\nCTX"
    assert template.question_text("why?") == "\nQ: why?\nA:"
    no_question = PromptTemplate.parse("Complete the code:\n{context}Next line:")
    assert not no_question.asks and no_question.question_text("ignored") == "Next line:"
    default = PromptTemplate.parse(LONGBENCH_QA)
    assert default.context_text("C").endswith("briefly.\n\nC")
    assert default.question_text("Q").endswith("Question: Q\nAnswer:")
    for bad, words in [("{context} {question}", "the fields are"),
                       ("{input} {context}", "before {context}"),
                       ("{context} {context}", "2 {context} fields"),
                       ("{input}", "0 {context} fields"),
                       ("{context} {input} {input}", "more than one {input}"),
                       ("{context!r}", "no conversion"),
                       ("{context} }", "literal brace")]:
        with pytest.raises(ValueError, match=words):
            PromptTemplate.parse(bad)


def test_middle_truncation_keeps_the_first_and_last_halves():
    from kvbench.benchmarks.measure.dataset import middle_cut

    prompt = Prompt(list(range(100)), list(range(100, 110)))
    cut = middle_cut(prompt, 40)
    assert cut.context == list(range(20)) + list(range(90, 100))
    assert cut.question == list(range(100, 110))
    assert len(middle_cut(prompt, 41).ids) == 40  # two halves of 20, as LongBench's int(41 / 2)
    assert middle_cut(prompt, 110) == prompt
    # a question longer than half the budget is cut too, at its start, as LongBench would
    long_question = Prompt(list(range(10)), list(range(10, 60)))
    cut = middle_cut(long_question, 40)
    assert cut.context == list(range(10))
    assert cut.question == list(range(10, 20)) + list(range(40, 60))


# ---------------------------------------------------------------- validate


SUITE = """\
kvbench: 1
name: dataset-tiny
defaults: {model: "bundled:smollm2-135m", device: cpu, threads: 1}
methods:
  - {name: identity}
  - {name: intq, label: intq4, params: {bits: 4, group_size: 32, axis: token}}
benchmarks:
  - kind: dataset
    params:
      data: %(qa)s
      max_length: 160
      answer_tokens: 8
    matrix:
      truncation: [middle, skip]
  - kind: dataset
    params:
      data: %(trec)s
      metric: classification
      # LongBench's trec prompt (a folded line: one space)
      template: "Please determine the type of the question below. Here are some examples of
        questions.\\n\\n{context}\\n{input}"
      chat_template: false
      first_line: true
      answer_tokens: 6
"""


def _suite(tmp_path, text: str):
    suite = tmp_path / "suite.yaml"
    suite.write_text(text)
    return suite


def _issue(suite, key: str):
    with pytest.raises(SuiteError) as refused:
        load_suite(suite)
    found = [issue for issue in refused.value.issues if issue.key == key]
    assert found, refused.value
    return found[0]


def test_a_missing_file_is_refused_at_its_key(tmp_path):
    suite = _suite(tmp_path, SUITE % {"qa": "qa_missing.jsonl", "trec": TREC})
    issue = _issue(suite, "benchmarks[0].params.data")
    assert issue.line == line_of(suite, "qa_missing.jsonl")
    assert str(tmp_path / "qa_missing.jsonl") in issue.message  # resolved beside the suite
    assert "does not exist" in issue.message


def test_a_missing_field_is_refused_at_the_key_that_maps_it(tmp_path):
    text = SUITE.replace("      answer_tokens: 8\n", "      answer_tokens: 8\n"
                         "      answers_field: answer\n")
    suite = _suite(tmp_path, text % {"qa": QA, "trec": TREC})
    issue = _issue(suite, "benchmarks[0].params.answers_field")
    assert issue.line == line_of(suite, "answers_field: answer")
    assert str(QA) in issue.message and "'answer'" in issue.message
    # a default mapping the file lacks: blamed at the data, naming the field
    text = SUITE.replace("      metric: classification\n", "      metric: classification\n"
                         "      classes_field: labels\n")
    suite = _suite(tmp_path, text % {"qa": QA, "trec": TREC})
    issue = _issue(suite, "benchmarks[1].params.classes_field")
    assert "'labels'" in issue.message and str(TREC) in issue.message
    (tmp_path / "plain.jsonl").write_text('{"text": "c", "answers": ["a"]}\n')
    suite = _suite(tmp_path, SUITE % {"qa": "plain.jsonl", "trec": TREC})
    issue = _issue(suite, "benchmarks[0].params.data")
    assert "no field 'context' (the context)" in issue.message


def test_validate_says_where(tmp_path, wide_consoles):
    text = SUITE.replace("max_length: 160\n", "max_length: 160\n      samples: 9\n")
    suite = _suite(tmp_path, text % {"qa": QA, "trec": TREC})
    result = invoke("validate", suite)
    assert result.exit_code == 2
    assert (f"{suite}:{line_of(suite, 'samples: 9')}: benchmarks[0].params.samples: samples 9"
            " is above the 4 rows") in result.output
    template = SUITE.replace("{context}\\n{input}", "{input}\\n{context}")
    suite = _suite(tmp_path, template % {"qa": QA, "trec": TREC})
    assert _issue(suite, "benchmarks[1].params.template").line == line_of(suite, "template:")


def test_the_model_must_hold_the_prompt_and_the_answer(tmp_path):
    suite = _suite(tmp_path, SUITE.replace("max_length: 160", "max_length: 8190")
                   % {"qa": QA, "trec": TREC})
    assert "max_length + answer_tokens = 8198 tokens" in _issue(
        suite, "benchmarks[0].params.max_length").message


def test_the_shipped_suite_reads_the_jsonl_beside_it():
    suite = load_suite(SHIPPED)
    assert {case.method_label for case in suite.cases} >= {"identity", "intq4"}
    [data] = {case.bench_params["data"] for case in suite.cases}
    assert data == str(ROOT / "suites" / "data" / "archive_qa.jsonl")
    assert len(read_records(data, LONGBENCH_FIELDS)) == 24


# ---------------------------------------------------------------- a run


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """identity and intq4 over both fixtures through `kvbench run` (shared)."""
    folder = tmp_path_factory.mktemp("dataset")
    suite = folder / "suite.yaml"
    suite.write_text(SUITE % {"qa": QA, "trec": TREC})
    result = invoke("run", suite, "--out", folder / "out")
    assert result.exit_code == 0, result.output
    return folder / "out"


@pytest.mark.model
def test_the_fixture_runs_and_keeps_every_answer(tiny_run):
    run = load_results(tiny_run / "results.json")
    assert [c.status for c in run.cases] == ["ok"] * 6
    kept = [json.loads(line) for line in (tiny_run / PREDICTIONS).read_text().splitlines()]
    trec = {r.row: r for r in read_records(str(TREC), Fields("context", "input", "answers",
                                                              "all_classes"))}
    for case in run.cases:
        mine = [r for r in kept if r["case"] == case.id]
        info = case.info
        assert info["rows"] == [r["row"] for r in mine]
        assert info["scores"] == [r["score"] for r in mine]
        assert len(info["generated"]) == len(info["answer_s"]) == len(mine)
        assert case.metrics["score"].value == pytest.approx(statistics.fmean(info["scores"]))
        low, high = case.metrics["score_ci_low"].value, case.metrics["score_ci_high"].value
        assert low <= case.metrics["score"].value <= high
        params = case.bench_params
        for record in mine:
            classes = trec[record["row"]].classes if params["metric"] == "classification" else ()
            assert record["score"] == sample_score(record["prediction"], record["references"],
                                                   params["metric"], classes,
                                                   params["first_line"])
            assert 0 <= record["generated"] <= params["answer_tokens"]
            if params["metric"] == "qa_f1":
                assert record["prompt_tokens"] <= 160
    by = {(c.method_label, c.bench_params.get("truncation"), c.bench_params["metric"]): c
          for c in run.cases}
    cut, skipped = by["identity", "middle", "qa_f1"], by["identity", "skip", "qa_f1"]
    assert cut.info["truncated_rows"] == [2] and cut.info["rows"] == [0, 1, 2, 3]
    assert skipped.info["skipped_rows"] == [2] and skipped.info["rows"] == [0, 1, 3]
    assert (skipped.metrics["skipped"].value, skipped.metrics["scored"].value) == (1, 3)
    assert (cut.metrics["truncated"].value, cut.metrics["skipped"].value) == (1, 0)
    # the rows that fit are the same prompts, and answers, in both
    assert [h for h, row in zip(cut.info["prompt_sha256s"], cut.info["rows"]) if row != 2] == \
        skipped.info["prompt_sha256s"]
    assert [s for s, row in zip(cut.info["scores"], cut.info["rows"]) if row != 2] == \
        skipped.info["scores"]
    assert by["intq4", "middle", "qa_f1"].comparable["prompts_sha256"] == \
        cut.comparable["prompts_sha256"]
    ratio = by["intq4", "middle", "qa_f1"].metrics["compression_ratio"].value
    assert ratio > 2 * cut.metrics["compression_ratio"].value  # 4-bit against float32


@pytest.mark.model
def test_the_report_pairs_each_method_with_identity(tiny_run):
    report = (tiny_run / "report.md").read_text()
    assert "### dataset: score per method [95% CI]" in report
    assert "### dataset: against identity, on the same samples" in report
    assert "### dataset: output length, paired with identity's answers" in report
    for scope, pairs in [("qa_mini.jsonl · qa_f1 (truncation=middle)", 4),
                         ("qa_mini.jsonl · qa_f1 (truncation=skip)", 3),
                         ("trec_mini.jsonl · classification |", 3)]:
        rows = [line for line in report.splitlines()
                if line.startswith(f"| intq4 | {scope}") and "/" in line]
        assert rows, (scope, report)
        assert rows[0].split("|")[3].strip() == str(pairs)  # the paired table's pairs
