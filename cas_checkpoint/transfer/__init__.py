"""Moving threads between stores: bundles, copies and the receiving end."""
