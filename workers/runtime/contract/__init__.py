"""The runtime's contract with the control plane: the job spec it accepts and the events it emits."""
