"""Rules: the safety verdicts that judge facts (docs/concepts/safety-rules.md): a GPU's passthrough
readiness (``assess``) and its verdict for the use its host declares (``intent``). Pure."""
