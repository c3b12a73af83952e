"""The lag view, its status evaluator, the doctor and the drain simulator."""
