"""Models with string (BYTES) tensors, for the ONNX engine (docs/strings.md).

- `spam_pipeline`: a scikit-learn pipeline exported by skl2onnx, the converter the ecosystem
  uses: a one-hot encoded `city` (string), a TF-IDF of `text` (string: normalised and
  tokenised inside the ONNX graph) and a scaled `amount` (float) feed a logistic regression
  whose classes are strings. Inputs `city`, `text` (string [batch, 1]) and `amount` (float
  [batch, 1]); outputs `label` (string [batch]) and `probabilities` (float [batch, 2]).
  Trained on a fixed-seed synthetic set (no data set can be downloaded here).
- `word_map`: strings in, strings out, any number per row: ONNX-ML's LabelEncoder maps words
  to other words (unknown words to "<unk>") and `echo` returns the input untouched.

    python examples/string_models.py --out DIR   # writes DIR/spam_pipeline.onnx, DIR/word_map.onnx
"""

from __future__ import annotations

import argparse
import os

import numpy as np

CITIES = np.array(["paris", "berlin", "madrid", "rome"])
WORDS = "cheap offer win money meeting lunch report project free click schedule team".split()
SPAM_WORDS = ("free", "win", "cheap")
WORD_MAP = {"cat": "chat", "dog": "chien", "house": "maison", "café": "coffee", "": "<empty>"}


def spam_data(n: int, seed: int = 0):
    """(city, text, amount) columns and string labels, from a fixed seed."""
    rng = np.random.default_rng(seed)
    city = rng.choice(CITIES, (n, 1)).astype(object)
    text = np.array([[" ".join(rng.choice(WORDS, 5))] for _ in range(n)], dtype=object)
    amount = rng.standard_normal((n, 1)).astype(np.float32)
    labels = np.array(["spam" if any(w in t[0].split() for w in SPAM_WORDS) else "ham" for t in text])
    return city, text, amount, labels


def spam_pipeline():
    """(ONNX model, fitted scikit-learn pipeline)."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    city, text, amount, labels = spam_data(400)
    features = np.hstack([city, text, amount.astype(object)])
    pre = ColumnTransformer([("city", OneHotEncoder(handle_unknown="ignore"), [0]),
                             ("text", TfidfVectorizer(), 1),
                             ("amount", StandardScaler(), [2])])
    pipe = Pipeline([("features", pre), ("classifier", LogisticRegression(max_iter=500))]).fit(features, labels)
    onx = to_onnx(
        pipe,
        initial_types=[("city", StringTensorType([None, 1])), ("text", StringTensorType([None, 1])),
                       ("amount", FloatTensorType([None, 1]))],
        # plain tensors out (no ZipMap); the lower-casing runs in the C.UTF-8 locale, which every
        # glibc has (skl2onnx's default, en_US.UTF-8, is often not installed)
        options={LogisticRegression: {"zipmap": False}, TfidfVectorizer: {"locale": "C.UTF-8"}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    return onx, pipe


def word_map():
    import onnx
    from onnx import TensorProto, helper

    keys, values = list(WORD_MAP), list(WORD_MAP.values())
    graph = helper.make_graph(
        [helper.make_node("LabelEncoder", ["words"], ["mapped"], domain="ai.onnx.ml",
                          keys_strings=keys, values_strings=values, default_string="<unk>"),
         helper.make_node("Identity", ["words"], ["echo"])],
        "word_map",
        [helper.make_tensor_value_info("words", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("mapped", TensorProto.STRING, ["batch", "n"]),
         helper.make_tensor_value_info("echo", TensorProto.STRING, ["batch", "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_all(out_dir: str) -> None:
    import onnx

    os.makedirs(out_dir, exist_ok=True)
    onnx.save(spam_pipeline()[0], os.path.join(out_dir, "spam_pipeline.onnx"))
    onnx.save(word_map(), os.path.join(out_dir, "word_map.onnx"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    write_all(args.out)
    print(f"wrote spam_pipeline.onnx and word_map.onnx to {args.out}")
