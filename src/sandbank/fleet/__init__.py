"""The fleet: sandboxes on many nodes behind stateless fronts."""
