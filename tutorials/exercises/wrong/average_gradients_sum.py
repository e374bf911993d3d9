"""Wrong result: sums the gradients over the ranks but forgets to divide by N."""
from tutorials.exercises.solutions.all_reduce import all_reduce


def average_gradients(model, group=None):
    for param in model.parameters():
        all_reduce(param.grad)          # then param.grad /= world size is missing
