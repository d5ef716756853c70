"""Reading states apart: walk a state's tree, diff two states, search values."""
