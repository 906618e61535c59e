"""CPU-scale experiments of the deep part: ResNet fine-tuning under init-scale interventions
(:mod:`.resnet`), a Transformer on modular arithmetic under balancedness (:mod:`.modular`), and the
claim verdicts with intervals over seeds (:mod:`.claims`)."""
