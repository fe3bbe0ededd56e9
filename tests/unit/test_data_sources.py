"""Sources beyond plain files: datasets saved with `save_to_disk`, and pre-tokenised mlperf packs."""

import itertools
import json
import pickle

import datasets
import numpy as np
import pytest
from transformers import AutoTokenizer

from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.config.sections.data import DataSection, DataSource
from tuneforge.data.cache import cache_key
from tuneforge.data.reading import read_conversations
from tuneforge.data.records import DataError
from tuneforge.data.token_store import IGNORE_INDEX, TokenStore
from tuneforge.data.training_data import load_training_data

ALPACA = [
    {"instruction": f"add {i} and 1", "input": "", "output": str(i + 1), "system": None}
    for i in range(6)
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)


def test_a_saved_dataset_reads_like_the_same_records_in_jsonl(tmp_path):
    datasets.Dataset.from_list(ALPACA).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "same.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ALPACA))
    saved, _ = read_conversations(tmp_path / "saved", "alpaca")
    plain, _ = read_conversations(tmp_path / "same.jsonl", "alpaca")
    assert [c.messages for c in saved] == [c.messages for c in plain]
    assert saved[2].origin == f"{tmp_path / 'saved'} row 2"


def test_a_directory_of_saved_datasets_reads_each_once(tmp_path):
    for name in ("a", "b"):
        datasets.Dataset.from_list(ALPACA).save_to_disk(str(tmp_path / "all" / name))
    found, _ = read_conversations(tmp_path / "all", "alpaca")
    assert len(found) == 2 * len(ALPACA)  # state.json / dataset_info.json are not data files


def test_a_dataset_dict_asks_for_a_split(tmp_path):
    split = datasets.Dataset.from_list(ALPACA)
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"splits test, train: point the path at one split"):
        read_conversations(tmp_path / "dd", "alpaca")
    assert len(read_conversations(tmp_path / "dd" / "train", "alpaca")[0]) == len(ALPACA)


def test_a_saved_dataset_changing_changes_the_cache_key(tmp_path, tokenizer):
    datasets.Dataset.from_list(ALPACA).save_to_disk(str(tmp_path / "saved"))
    source = DataSource(path=tmp_path / "saved", format="alpaca")
    before = cache_key([source], tokenizer, {})
    changed = [dict(r, output="changed") for r in ALPACA]
    datasets.Dataset.from_list(changed).save_to_disk(str(tmp_path / "other"))
    for file in (tmp_path / "other").iterdir():
        (tmp_path / "saved" / file.name).write_bytes(file.read_bytes())
    assert cache_key([source], tokenizer, {}) != before


def write_packs(file, packs):
    array = np.empty(len(packs), dtype=object)
    array[:] = packs
    np.save(file, array, allow_pickle=True)


def reference_labels(ids: list[int], mask: list[int], starts: list[int]) -> list[int]:
    """NeMo's reading of a pack: inside each document, token t+1 is the target of token t when
    loss_mask[t+1] is 1; nothing is predicted across a boundary."""
    labels = []
    for start, end in zip(starts, [*starts[1:], len(ids)], strict=True):
        for t in range(start, end):
            last = t + 1 == end
            labels.append(IGNORE_INDEX if last or not mask[t + 1] else ids[t + 1])
    return labels


def random_pack(generator, documents: int):
    lengths = generator.integers(2, 12, documents).tolist()
    ids = generator.integers(0, 200, sum(lengths)).tolist()
    mask = generator.integers(0, 2, sum(lengths)).tolist()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist()
    return {"input_ids": ids, "loss_mask": mask, "seq_start_id": starts}


def test_mlperf_packs_are_cut_at_seq_start_id_with_their_loss_mask(tmp_path):
    generator = np.random.default_rng(0)
    packs = [random_pack(generator, documents) for documents in (3, 1, 5)]
    write_packs(tmp_path / "train.npy", packs)
    documents, _ = read_conversations(tmp_path / "train.npy", "mlperf")
    assert len(documents) == 9 and documents[3].origin.endswith("pack 1 document 0")
    store = TokenStore(
        np.concatenate([d.pretokenized[0] for d in documents]),
        np.concatenate([d.pretokenized[1] for d in documents]),
        np.concatenate([[0], np.cumsum([len(d.pretokenized[0]) for d in documents])]),
    )
    ids, labels = store.arrays(list(range(len(documents))))
    expected_ids = [t for pack in packs for t in pack["input_ids"]]
    expected_labels = [
        label
        for pack in packs
        for label in reference_labels(pack["input_ids"], pack["loss_mask"], pack["seq_start_id"])
    ]
    assert ids.tolist() == expected_ids and labels.tolist() == expected_labels


def test_mlperf_documents_never_share_attention_in_training_batches(tmp_path, tokenizer):
    generator = np.random.default_rng(1)
    packs = [random_pack(generator, 4) for _ in range(6)]
    write_packs(tmp_path / "train.npy", packs)
    data = DataSection(
        train=[DataSource(path=tmp_path / "train.npy", format="mlperf")],
        max_seq_len=16,
        cache=False,
    )
    loaded = load_training_data(data, tokenizer, tokens_per_micro_batch=64, seed=0)
    documents = {
        tuple(pack["input_ids"][s:e])
        for pack in packs
        for s, e in zip(
            pack["seq_start_id"], [*pack["seq_start_id"][1:], len(pack["input_ids"])], strict=True
        )
        if any(pack["loss_mask"][s + 1 : e])
    }
    seen = set()
    for index in range(len(loaded.loader.bins)):
        batch = loaded.loader.batch(index)
        bounds = batch.packed.cu_seqlens.tolist()
        for start, end in itertools.pairwise(bounds):
            seen.add(tuple(batch.tokens[start:end].tolist()))
    assert seen == documents


def test_mlperf_file_cannot_run_code(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    with (tmp_path / "evil.npy").open("wb") as handle:
        np.lib.format.write_array_header_1_0(
            handle, {"descr": "|O", "fortran_order": False, "shape": (1,)}
        )
        pickle.dump(Payload(), handle, protocol=3)
    with pytest.raises(DataError, match=r"evil.npy: cannot be read safely .*system.*not data"):
        read_conversations(tmp_path / "evil.npy", "mlperf")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("pack", "reason"),
    [
        ({"input_ids": [1, 2], "loss_mask": [0, 1]}, 'missing field "seq_start_id"'),
        ({"input_ids": [1, 2], "loss_mask": [1], "seq_start_id": [0]}, "1 entries for 2 tokens"),
        ({"input_ids": [1, 2], "loss_mask": [0, 2], "seq_start_id": [0]}, "only 0 and 1"),
        ({"input_ids": [1, 2], "loss_mask": [0, 1], "seq_start_id": [1]}, "start with 0"),
        ({"input_ids": [1, 2], "loss_mask": [0, 1], "seq_start_id": [0, 0]}, "must increase"),
        ({"input_ids": [1, 2], "loss_mask": [0, 1], "seq_start_id": [0, 5]}, "must increase"),
        ({"input_ids": ["a"], "loss_mask": [0], "seq_start_id": [0]}, "list of integers"),
        ([1, 2, 3], "expected a dict"),
    ],
)
def test_bad_mlperf_packs_are_named(tmp_path, pack, reason):
    good = {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "seq_start_id": [0]}
    write_packs(tmp_path / "d.npy", [good, pack])
    with pytest.raises(DataError, match=rf"d.npy pack 1: .*{reason}"):
        read_conversations(tmp_path / "d.npy", "mlperf")
    kept, bad = read_conversations(tmp_path / "d.npy", "mlperf", on_bad_record="skip")
    assert len(kept) == 1 and bad.count == 1


def test_mlperf_metadata_is_checked(tmp_path):
    packs = [random_pack(np.random.default_rng(2), 3) for _ in range(2)]
    write_packs(tmp_path / "d.npy", packs)
    longest = max(len(p["input_ids"]) for p in packs)
    meta = tmp_path / "meta.jsonl"
    meta.write_text(json.dumps([{"pack_size": longest, "max_samples_per_bin": 3}]))
    assert len(read_conversations(tmp_path / "d.npy", "mlperf", metadata=meta)[0]) == 6
    meta.write_text(json.dumps({"pack_size": longest - 1}))
    with pytest.raises(DataError, match=r"tokens, but .*meta.jsonl says pack_size="):
        read_conversations(tmp_path / "d.npy", "mlperf", metadata=meta)


def test_mlperf_tokens_outside_the_vocabulary_are_refused(tmp_path, tokenizer):
    pack = {"input_ids": [1, len(tokenizer) + 5], "loss_mask": [0, 1], "seq_start_id": [0]}
    write_packs(tmp_path / "d.npy", [pack])
    data = DataSection(
        train=[DataSource(path=tmp_path / "d.npy", format="mlperf")], max_seq_len=16, cache=False
    )
    with pytest.raises(DataError, match="outside the tokenizer's vocabulary"):
        load_training_data(data, tokenizer, 64, seed=0)


def test_a_plain_npy_or_a_text_format_on_npy_is_explained(tmp_path):
    np.save(tmp_path / "plain.npy", np.arange(10))
    with pytest.raises(DataError, match="plain int64 array; format mlperf expects one dict"):
        read_conversations(tmp_path / "plain.npy", "mlperf")
    with pytest.raises(DataError, match="set the source's format: mlperf"):
        read_conversations(tmp_path / "plain.npy", "openai")
