"""JSON Schema to GBNF, bounded before anything is built (issue 35).

llama-cpp-python's converter (a port of an older llama.cpp one) expanded repetition bounds into
text before any size check (``minItems: 5e7`` took seconds and gigabytes in the daemon),
wrote an alternation of every enum value (50,000 words stalled every stream on the model:
llama.cpp's grammar sampler keeps one stack per alternative and compares them pairwise),
dropped keywords it did not know (``maximum``), broke on a ``"`` in a constant and recursed
per optional property. This package replaces it:

- :mod:`.keywords`: each keyword's treatment, declared once (the docs list derives from it);
- :mod:`.gbnf`: the grammar being built (rules, literals, a size cap checked as it grows),
  literal alternations as a prefix tree, the repetition syntax llama.cpp expands itself;
- :mod:`.numbers`: integer ranges as digit grammars (``minimum``/``maximum``);
- :mod:`.pattern`: ``pattern`` regular expressions, their quantifiers bounded;
- :mod:`.convert`: the schema walk, refusing what it cannot hold with the keyword's path.

Pure: no llama_cpp (modeld.daemon.grammar has llama.cpp's parser check the result).
"""

from modeld.schema.convert import to_gbnf

__all__ = ["to_gbnf"]
