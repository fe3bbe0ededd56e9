"""Values computed before training ride with each batch of their documents: one per document,
or one row per supervised token, in the order the batch holds its supervised tokens."""

import numpy as np

from tuneforge.data.packing import IGNORE_INDEX, PackedLoader
from tuneforge.data.side_data import DocumentValues, TokenRows, supervised_offsets
from tuneforge.data.token_store import make_example


def test_each_batch_carries_its_documents_values_and_its_supervised_tokens_rows():
    rng = np.random.default_rng(0)
    examples = []
    for length in (5, 9, 3, 12, 7, 4, 8, 6):
        mask = [False, *(rng.random(length - 1) < 0.6)]
        examples.append(make_example(rng.integers(0, 50, length).tolist(), mask))
    loader = PackedLoader(examples, budget=16, seed=0)
    store = loader.store
    offsets = supervised_offsets(np.asarray(store.loss_mask), np.asarray(store.offsets))
    # a direct count: each document's labels that are targets
    counts = [sum(label != IGNORE_INDEX for label in example.labels) for example in examples]
    assert offsets.tolist() == np.concatenate([[0], np.cumsum(counts)]).tolist()
    # row r of the store holds the r-th target's label: the batch's targets must match
    labels = np.concatenate([[x for x in e.labels if x != IGNORE_INDEX] for e in examples])
    values = np.arange(len(examples), dtype=np.float32) * 10
    for side_data in (
        DocumentValues({"v": values}),
        TokenRows({"label": labels[:, None]}, offsets),
    ):
        loader.side_data = side_data
        for index, documents in enumerate(loader.bins):
            batch = loader.batch(index)
            if isinstance(side_data, DocumentValues):
                assert batch.extras["v"].tolist() == [10 * d for d in documents]
            else:
                targets = batch.labels[batch.labels != IGNORE_INDEX]
                assert batch.extras["label"][:, 0].tolist() == targets.tolist()
