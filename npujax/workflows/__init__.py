"""End-to-end workflows built on the library: the demo, the QAT-vs-PTQ experiment, ..."""
