"""Core: the words every layer speaks, and nothing else of gpuprov below it: a plan's
:class:`~gpuprov.core.plan.Action`, :class:`~gpuprov.core.plan.Refusal` and
:class:`~gpuprov.core.plan.Plan`, and the VM list's data (:mod:`gpuprov.core.vm_spec`)."""
