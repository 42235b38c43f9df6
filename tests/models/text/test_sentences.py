# ruff: noqa: RUF001 - the fixtures are prose in scripts with their own punctuation
"""Sentences of Markdown and reST documents and of non-English prose, for extractive summaries."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from batchscore.job.sections import InputConfig, ModelConfig, SummarizeConfig
from batchscore.models.summarize import SummarizeTask
from batchscore.models.text.markup import prose
from batchscore.models.text.sentences import (
    is_lead_in,
    is_sentence,
    split_sentences,
    summary_sentences,
)
from batchscore.runtime.executor import Executor

MARKDOWN = """\
# batchscore

[![CI](https://github.com/acme/batchscore/actions/badge.svg)](https://github.com/acme/ci)
<p align="center"><img src="logo.png"></p>

Score every row of a folder of Parquet shards with a PyTorch model. A killed run resumes
where it stopped, and never loses or duplicates a row.

## Install

With pip:

```bash
pip install batchscore
```

~~~
make setup
~~~

Setup
-----

* Rows are sorted into length buckets, so almost no compute goes to padding.
1. Each chunk of output is committed atomically with a checkpoint.

| option | default |
|--------|---------|
| sort   | true    |

***

Read the [design notes](https://example.com/design) before changing the sampler.

[design notes]: https://example.com/design
"""

REST = """\
=========
batchscore
=========

Score every row of a folder of Parquet shards with a PyTorch model.

Installation
============

With pip::

    pip install batchscore

.. code:: python

    import batchscore
    batchscore.run("jobs/embed.toml")

.. note:: The GPU is optional.

   A run on the CPU gives the same results, only more slowly.

.. _design: https://example.com/design
.. |badge| image:: https://example.com/badge.svg

Example:

>>> batchscore.score(table, task="embed")
pyarrow.Table

The scored table comes back in input order, with the task's columns added.
The sampler is equivalent to this:

   for window in windows:
       cut(window)

Options:
  --restart  discard committed output
"""


def test_markdown_keeps_prose_only():
    assert summary_sentences(MARKDOWN) == [
        "Score every row of a folder of Parquet shards with a PyTorch model.",
        "A killed run resumes where it stopped, and never loses or duplicates a row.",
        "Rows are sorted into length buckets, so almost no compute goes to padding.",
        "Each chunk of output is committed atomically with a checkpoint.",
        "Read the design notes before changing the sampler.",
    ]


def test_rest_keeps_prose_only():
    assert summary_sentences(REST) == [
        "Score every row of a folder of Parquet shards with a PyTorch model.",
        "The GPU is optional.",
        "A run on the CPU gives the same results, only more slowly.",
        "The scored table comes back in input order, with the task's columns added.",
        "--restart discard committed output",  # "The sampler is equivalent to this:" leads in
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("これはペンです。あれは本です！本当ですか？はい",
         ["これはペンです。", "あれは本です！", "本当ですか？", "はい"]),
        ("今天天气很好。我们去公园吧！", ["今天天气很好。", "我们去公园吧！"]),
        ("Really?! Yes... Wait... what? Done!!! Version 3.14 is out. See https://x.org. Then go.",
         ["Really?!", "Yes...", "Wait... what?", "Done!!!", "Version 3.14 is out.",
          "See https://x.org.", "Then go."]),
        ("Привет, мир. Как дела? Всё хорошо, т.е. нормально. Проф. Иванов согласен.",
         ["Привет, мир.", "Как дела?", "Всё хорошо, т.е. нормально.", "Проф. Иванов согласен."]),
        ("Das ist z.B. ein Test. Er sagte: „Ja.“ Dann ging er, vgl. S. 4. Ende.",
         ["Das ist z.B. ein Test.", "Er sagte: „Ja.“", "Dann ging er, vgl. S. 4.", "Ende."]),
        ("¿Qué hora es? Son las tres. ¡Vamos! El Sr. Pérez espera.",
         ["¿Qué hora es?", "Son las tres.", "¡Vamos!", "El Sr. Pérez espera."]),
        ("यह पहला वाक्य है। यह दूसरा वाक्य है।", ["यह पहला वाक्य है।", "यह दूसरा वाक्य है।"]),
        ('He said "Stop." Then the U.S. Army came, i.e. late.',
         ['He said "Stop."', "Then the U.S. Army came, i.e. late."]),
    ],
)  # fmt: skip
def test_sentences_beyond_english_punctuation(text, expected):
    assert split_sentences(text) == expected


def test_fragments_that_are_not_sentences():
    assert not is_sentence("With pip:") and not is_sentence("For example, do this:")
    assert not is_sentence("v1.2") and not is_sentence("---  ***") and not is_sentence("Yes.")
    assert is_sentence("It works well.") and is_sentence("これはペンです。")
    assert is_sentence("Note: the GPU is optional.")  # a colon inside a sentence is prose
    assert summary_sentences("## Only a title") == ["## Only a title"]  # nothing better
    assert summary_sentences("One line.") == ["One line."]
    assert prose("Args:\n    x: the value to score.") == ["x: the value to score."]


@pytest.mark.parametrize(
    "lead_in",
    [
        "The following options are supported by every command:",
        "Then, you can install boto3 from PyPI with:",
        "**Disabling through the environment variable:**",  # the colon inside the emphasis
        "使用以下命令安装这个软件包：",  # the full-width colon CJK text uses
    ],
)
def test_a_lead_in_is_never_a_summary_sentence(lead_in):
    assert is_lead_in(lead_in) and not is_sentence(lead_in)
    document = f"It scores rows in batches.\n\n{lead_in}\n\n- one list item here.\n"
    assert summary_sentences(document) == ["It scores rows in batches.", "one list item here."]
    # a document of nothing but a lead-in and its code still gets a summary, not the lead-in
    assert summary_sentences(f"{lead_in}\n\n```\npip install x\n```") == ["``` pip install x ```"]
    table = f"{lead_in}\nname | value\n--- | ---\nmodel | batch\n"  # no blank line between
    assert summary_sentences(table) == ["name | value --- | --- model | batch"]


def test_tables_and_list_items_after_a_colon():
    document = """\
The columns it writes are these:
name | type
--- | ---
label | string

It writes them in input order.

=====  ======
name   type
=====  ======
score  float
=====  ======

* **Version 0** behaviour, compatible with the re module:

  Its behaviour may change over time to match the module.

* An item that shows its code::

      make test

  The tests run on the CPU.
"""
    assert summary_sentences(document) == [
        "It writes them in input order.",
        "Its behaviour may change over time to match the module.",
        "The tests run on the CPU.",
    ]


@pytest.fixture(scope="module")
def task(minilm_path):
    model = ModelConfig(task="summarize", precision="fp32", threads=1)
    return SummarizeTask(minilm_path, model=model, options=SummarizeConfig(sentences=2),
                         inp=InputConfig(path=()), executor=Executor(model))  # fmt: skip


def test_summaries_of_markup_documents_are_prose(task):
    encoded = task.encode(pa.table({"text": [MARKDOWN, REST]}))
    units = np.arange(len(encoded.lengths))
    results = task.forward(encoded, units)
    summaries = task.finish(encoded, results)["summary"].to_pylist()
    for document, summary in zip((MARKDOWN, REST), summaries, strict=True):
        picked = [s for s in summary_sentences(document) if s in summary]
        assert len(picked) == 2 and summary == " ".join(picked)
        for markup in ("#", "```", "::", "pip install", "http", "|", "With pip"):
            assert markup not in summary
