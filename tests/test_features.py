"""Job.features is what the converters write (issue 22): the run's readers parse with it alone.

For any config of electra_zh_en (both formats) and causal_lm, every example the real
converter writes holds exactly the declared features, with their lengths and dtypes:
in TFRecords (read by fleet_jobs.text's decoder and by TensorFlow's parser with the spec the
readers build) and in Parquet rows (pyarrow's schema and row lengths).
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.job import ItemContext, load_job
from fleet.formats import tfrecord
from fleet_jobs.text.tokenizers.vocab import train_vocab, write_vocab
from tests.helpers.sinks import MemorySink

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_documents(name: str) -> list[list[str]]:
    with open(os.path.join(ROOT, "corpus", name), encoding="utf-8") as f:
        return [block.split("\n") for block in f.read().split("\n\n") if block.strip()]


DOCUMENTS = read_documents("sample_zh.txt")[:6] + read_documents("sample_en.txt")[:6]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    write_vocab(train_vocab((line for d in DOCUMENTS for line in d), 2000), path)
    return path


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


outputs = st.sampled_from(
    [{"output": "tfrecord"}, {"output": "tfrecord", "compression": "GZIP"}, {"output": "parquet"}]
)
electra = st.fixed_dictionaries({"max_seq_length": st.integers(8, 96), "pack_documents": st.booleans()})
bert = st.fixed_dictionaries(
    {
        "max_seq_length": st.integers(16, 96),
        "max_predictions_per_seq": st.integers(1, 12),
        "v2_feature_names": st.booleans(),
        "pack_documents": st.booleans(),
    }
)
causal = st.fixed_dictionaries(
    {
        "max_seq_length": st.integers(2, 96),
        "shifted_labels": st.booleans(),
        "last_block": st.sampled_from(["pad", "drop"]),
        "pack_documents": st.booleans(),
    }
)
configs = st.one_of(
    st.tuples(st.just("electra_zh_en"), electra, outputs),
    st.tuples(st.just("bert"), bert, outputs),
    st.tuples(st.just("causal_lm"), causal, outputs),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs)
def test_every_example_written_holds_exactly_the_declared_features(vocab, case):
    name, options, output = case
    job = load_job(name)
    config = job.parse_config({"vocab_file": vocab, **options, **output})
    layout = job.features(config)
    sink = MemorySink()
    job.document_converter(config, read_file).convert(iter(DOCUMENTS), ItemContext("0", 7, "test"), sink)
    [(suffix, data)] = sink.files.items()
    expected = {fname: (f.length, np.dtype(f.dtype)) for fname, f in layout.items()}
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(data))
        assert sorted(table.column_names) == sorted(layout)
        assert table.num_rows > 0
        for fname, feature in layout.items():
            kind = table.schema.field(fname).type
            assert pa.types.is_list(kind)
            assert (pa.types.is_floating if feature.dtype == "float32" else pa.types.is_integer)(kind.value_type)
            assert set(pa.compute.list_value_length(table.column(fname)).to_pylist()) == {feature.length}
        return
    if suffix.endswith(".gz"):
        import gzip

        data = gzip.decompress(data)
    records = list(tfrecord.iter_records(data))
    assert records
    for record in records:
        example = tfrecord.parse_example(record)
        assert {fname: (len(v), v.dtype) for fname, v in example.items()} == expected
    tf = pytest.importorskip("tensorflow")
    from fleet.core.follow import feature_spec

    parsed = tf.io.parse_example(records, feature_spec(layout))  # TensorFlow's parser: fails on any other length
    assert {fname: (tuple(v.shape), v.dtype.as_numpy_dtype) for fname, v in parsed.items()} == {
        fname: ((len(records), length), dtype.type) for fname, (length, dtype) in expected.items()
    }


def test_a_job_declares_no_features_by_default():
    from tests.helpers.linejob import JOB

    assert JOB.features(JOB.parse_config({})) == {}


def test_a_feature_is_a_length_of_int64_or_float32():
    from fleet.job import Feature

    assert Feature(3) == Feature(3, "int64")
    for bad in ((3, "int32"), (-1, "int64")):
        with pytest.raises(ValueError, match="int64 or float32"):
            Feature(*bad)
