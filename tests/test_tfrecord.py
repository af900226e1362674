"""Hand-encoded Examples and TFRecord framing read back by TensorFlow itself."""

from __future__ import annotations

import random

import pytest

from fleet.formats import tfrecord
from fleet_jobs.electra_zh_en.builder import build_examples


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def tf_example(tf, features: list[tuple[str, str, list]]) -> "tf.train.Example":
    example = tf.train.Example()
    example.features.SetInParent()
    for name, kind, values in features:
        holder = example.features.feature[name]
        getattr(holder, kind).SetInParent()  # an empty list is still a present feature
        getattr(holder, kind).value.extend(values)
    return example


def electra_examples(max_length: int, n_docs: int = 6, seed: int = 1):
    rng = random.Random(seed)
    docs = [
        [[rng.randrange(5, 70000) for _ in range(rng.randrange(0, 90))] for _ in range(rng.randrange(1, 12))]
        for _ in range(n_docs)
    ]
    return list(build_examples(docs, max_length, 2, 3, random.Random(seed)))


def test_varints():
    assert tfrecord.encode_varint(0) == b"\x00"
    assert tfrecord.encode_varint(127) == b"\x7f"
    assert tfrecord.encode_varint(128) == b"\x80\x01"
    assert tfrecord.encode_varint(300) == b"\xac\x02"
    assert tfrecord.encode_varint(-1) == b"\xff" * 9 + b"\x01"
    assert all(tfrecord.VARINTS[i] == tfrecord.encode_varint(i) for i in range(0, 1 << 16, 7))
    assert tfrecord.varints([1, 300, -2, 1 << 40]) == b"".join(map(tfrecord.encode_varint, [1, 300, -2, 1 << 40]))


def test_tensorflow_reads_back_electra_records(tf, tmp_path):
    max_length = 128
    examples = electra_examples(max_length)
    path = tmp_path / "x.tfrecord"
    with open(path, "wb") as f:
        for ex in examples:
            f.write(
                tfrecord.frame(
                    tfrecord.int64_example(
                        {"input_ids": ex.input_ids, "input_mask": ex.input_mask, "segment_ids": ex.segment_ids}
                    )
                )
            )
    spec = {name: tf.io.FixedLenFeature([max_length], tf.int64) for name in ("input_ids", "input_mask", "segment_ids")}
    read = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(path))]
    assert len(read) == len(examples) > 5
    for parsed, ex in zip(read, examples):
        assert parsed["input_ids"].numpy().tolist() == ex.input_ids
        assert parsed["input_mask"].numpy().tolist() == ex.input_mask
        assert parsed["segment_ids"].numpy().tolist() == ex.segment_ids


ENCODERS = {
    "int64_list": tfrecord.int64_feature,
    "float_list": tfrecord.float_feature,
    "bytes_list": tfrecord.bytes_feature,
}


@pytest.mark.parametrize(
    "features",
    [
        [("input_ids", "int64_list", [2, 1000, 70000, 3, 0]), ("input_mask", "int64_list", [1, 1, 1, 1, 0])],
        [
            ("neg", "int64_list", [-1, -(1 << 63), (1 << 63) - 1]),
            ("empty", "int64_list", []),
            ("one", "int64_list", [5]),
        ],
        [
            ("f", "float_list", [0.5, -1.25, 3.0e38]),
            ("fe", "float_list", []),
            ("i", "int64_list", list(range(300))),
            ("b", "bytes_list", [b"abc", b"", bytes(range(256)) * 3]),
            ("be", "bytes_list", []),
        ],
        [],
    ],
)
def test_equals_tensorflow_example(tf, features):
    ours = tfrecord.example({name: ENCODERS[kind](values) for name, kind, values in features})
    assert tf.train.Example.FromString(ours) == tf_example(tf, features)


def test_packed_feature_equals_generic():
    mask = [1] * 100 + [0] * 28
    assert tfrecord.packed_int64_feature(bytes(mask)) == tfrecord.int64_feature(mask)
    assert tfrecord.packed_int64_feature(b"") == tfrecord.int64_feature([])


def test_framing_equals_tensorflow_writer(tf, tmp_path):
    records = [b"", b"x", bytes(range(256)) * 40, tfrecord.int64_example({"a": [1, 2, 3]})]
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(r)
    ours = b"".join(map(tfrecord.frame, records))
    assert path.read_bytes() == ours
    assert list(tfrecord.iter_records(ours)) == records


def test_iter_records_detects_corruption():
    data = tfrecord.frame(b"hello") + tfrecord.frame(b"world")
    with pytest.raises(ValueError, match="data checksum"):
        list(tfrecord.iter_records(data[:14] + b"J" + data[15:]))
    with pytest.raises(ValueError, match="length checksum"):
        list(tfrecord.iter_records(b"\x06" + data[1:]))
    with pytest.raises(ValueError, match="truncated"):
        list(tfrecord.iter_records(data[:-1]))


def test_rows_written_as_columns_are_the_bytes_of_tfrecord_example(tf):
    """fleet.formats.tfrecord.writer.encode_rows (the writer's column path) against the generic encoder and TensorFlow."""
    import numpy as np

    from fleet.formats.tfrecord.writer import encode_rows
    from fleet.formats.writer import Column

    rng = np.random.default_rng(3)
    columns = [Column("input_ids"), Column("attention_mask"), Column("weights", "float"), Column("wide")]
    values = {
        "input_ids": rng.integers(0, 70000, (5, 9)),
        "attention_mask": rng.integers(0, 2, (5, 9)),
        "weights": rng.random((5, 3)).astype(np.float32),
        "wide": rng.integers(0, 1 << 34, (5, 2)),
    }
    order = sorted(columns, key=lambda c: c.name)
    records = encode_rows(order, values)
    for i, record in enumerate(records):
        features = {
            c.name: (
                tfrecord.float_feature(values[c.name][i].tolist())
                if c.kind == "float"
                else tfrecord.int64_feature(values[c.name][i].tolist())
            )
            for c in columns
        }
        assert record == tfrecord.frame(tfrecord.example(features))
        parsed = tf.train.Example.FromString(list(tfrecord.iter_records(record))[0])
        assert list(parsed.features.feature["wide"].int64_list.value) == values["wide"][i].tolist()
    empty = encode_rows([Column("x")], {"x": np.zeros((2, 0), np.int64)})
    assert empty == [tfrecord.frame(tfrecord.int64_example({"x": []}))] * 2


def test_records_reads_a_file_as_iter_records_reads_its_bytes():
    import io

    rng = random.Random(5)
    records = [bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 30, 300)))) for _ in range(40)]
    data = b"".join(tfrecord.frame(r) for r in records)
    assert list(tfrecord.records(io.BytesIO(data))) == list(tfrecord.iter_records(data)) == records
    for damaged in (
        data[:-3],
        data[: -(len(tfrecord.frame(records[-1])) - 5)],
        data[:20] + b"\xff" + data[21:],
        data[:9] + b"\x00" + data[10:],
    ):
        with pytest.raises(ValueError) as from_bytes:
            list(tfrecord.iter_records(damaged))
        with pytest.raises(ValueError) as from_file:
            list(tfrecord.records(io.BytesIO(damaged)))
        assert str(from_file.value) == str(from_bytes.value)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=12))
def test_frames_laid_out_at_once_are_frame_of_each_record(records):
    """The batch encoders' framing (a table of headers, the data checksums filled in afterwards)
    gives ``frame``'s bytes: every TFRecord byte comes from one module's rules."""
    import numpy as np

    headers = tfrecord.frame_headers(max(map(len, records), default=0) + 1)
    assert all(headers[len(r)].tobytes() == tfrecord.frame_header(len(r)) for r in records)
    laid_out = b"".join(headers[len(r)].tobytes() + r + b"\0\0\0\0" for r in records)
    filled = tfrecord.checksum_frames(np.frombuffer(laid_out, np.uint8).copy(), [len(r) for r in records])
    assert filled == b"".join(map(tfrecord.frame, records))
    assert list(tfrecord.iter_records(filled)) == records


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, (1 << 20) - 1), min_size=2, max_size=24), st.integers(0, 24)), max_size=10
    ),
    st.booleans(),
)
def test_token_records_are_int64_examples(rows, small):
    """``token_records``' batch encoder gives ``int64_example``'s bytes of the padded features."""
    from types import SimpleNamespace

    from fleet_jobs.text.token_records import TokenRecordEncoder

    width = 24
    examples = []
    for ids, first in rows:
        ids = [i % (1 << 16) for i in ids] if small else ids
        examples.append(SimpleNamespace(input_ids=ids, length=len(ids), first_length=max(1, min(first, len(ids)))))
    encoder = TokenRecordEncoder(width, (1 << 16) - 1 if small else 1 << 20)
    expected = b"".join(
        tfrecord.frame(
            tfrecord.int64_example(
                {
                    "input_ids": ex.input_ids + [0] * (width - ex.length),
                    "input_mask": [1] * ex.length + [0] * (width - ex.length),
                    "segment_ids": [0] * ex.first_length
                    + [1] * (ex.length - ex.first_length)
                    + [0] * (width - ex.length),
                }
            )
        )
        for ex in examples
    )
    assert encoder.records(examples) == expected
    padded = [
        SimpleNamespace(
            input_ids=ex.input_ids + [0] * (width - ex.length), length=ex.length, first_length=ex.first_length
        )
        for ex in examples
    ]
    assert b"".join(map(encoder.record, padded)) == expected == encoder.records(padded)
