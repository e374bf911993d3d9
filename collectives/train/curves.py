"""What rank 0 writes after each epoch: metrics.json, metrics.csv, curves.png."""
import csv
import json
import os

from .checkpoint import save_atomic


def write_outputs(out, history):
    """metrics.json, metrics.csv and curves.png from the per-epoch records."""
    def write_json(tmp):
        with open(tmp, "w") as f:      # closed here: a full disk fails inside save_atomic, not later
            json.dump(history, f, indent=1)
    save_atomic(write_json, os.path.join(out, "metrics.json"))

    def write_csv(tmp):
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(history[0]))
            w.writeheader()
            w.writerows(history)
    save_atomic(write_csv, os.path.join(out, "metrics.csv"))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(epochs, [h["train_loss"] for h in history], "o-", label="train")
    a.plot(epochs, [h["test_loss"] for h in history], "o-", label="test")
    a.set_xlabel("epoch"), a.set_ylabel("cross-entropy loss"), a.legend()
    b.plot(epochs, [100 * h["test_accuracy"] for h in history], "o-")
    b.set_xlabel("epoch"), b.set_ylabel("test accuracy (%)")
    fig.suptitle(f"MNIST, {history[-1]['world_size']} ranks")
    fig.tight_layout()
    save_atomic(lambda tmp: fig.savefig(tmp, format="png", dpi=100), os.path.join(out, "curves.png"))
    plt.close(fig)
