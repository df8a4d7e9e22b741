"""Python control flow converted to lax: the AST passes and their run time
(docs/guide/control-flow.md)."""
