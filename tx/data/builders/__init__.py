"""tx's own TFDS builders: prepare local raw files as array_record, no TensorFlow.

- `text.TxText` ('tx_text'): a file, folder or glob -> `{'text': str}` records.
- `parallel.TxParallel` ('tx_parallel'): line-aligned file pairs -> `{'source', 'target'}`.
- `stdlib.TxStdlib` ('tx_stdlib'): the interpreter's standard-library `.py` files.
- `catalog`: TFDS catalog datasets (`tfds:NAME`), prepared with TensorFlow, read without.

Builders are made by the `*_builder(...)` factories, whose config names digest the
inputs (see `common`); `common.prepare(builder)` prepares once. Most code wants
`tx.data.sources.load_source` instead.
"""

from tx.data.builders.common import prepare
from tx.data.builders.parallel import TxParallel, parallel_builder
from tx.data.builders.stdlib import TxStdlib, stdlib_builder
from tx.data.builders.text import TxText, text_builder

__all__ = ['TxParallel', 'TxStdlib', 'TxText', 'parallel_builder', 'prepare', 'stdlib_builder',
           'text_builder']
