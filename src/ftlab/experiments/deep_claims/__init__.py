"""The deep-network studies of the paper's claims at CPU scale: two vision architectures under one
knob at a time (:mod:`.vision`), a Transformer on modular arithmetic under balancedness
(:mod:`.modular`), the paired effects and verdicts (:mod:`.claims`), figures (:mod:`.figures`) and
the end-to-end runner (:mod:`.pipeline`). Data: :mod:`.data`."""
