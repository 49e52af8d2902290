"""Multiple-choice questions: the concept check asked at the start and at the end of the lesson, the steps'
predict-then-reveal questions, and their grading. No Streamlit: the page keeps the picks in widget state only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Question:
    prompt: str
    options: tuple[str, ...]
    answer: int  # index into options
    why: str = ""  # one sentence said once the answer is shown

    def __post_init__(self) -> None:
        assert len(set(self.options)) == len(self.options) >= 2, self.options
        assert 0 <= self.answer < len(self.options), (self.answer, self.options)

    @property
    def right_option(self) -> str:
        return self.options[self.answer]

    def is_right(self, pick: str | None) -> bool | None:
        """True or False for a pick among the options; None when nothing (or something else) was picked."""
        return None if pick not in self.options else pick == self.right_option


def question(prompt: str, options: Sequence, answer, why: str = "") -> Question:
    """A Question whose options are any values (numbers, names), written with str(); `answer` is one of them."""
    shown = tuple(str(o) for o in options)
    return Question(prompt, shown, shown.index(str(answer)), why)


@dataclass(frozen=True)
class Grade:
    right: tuple[bool | None, ...]  # per question: True, False, or None where unanswered

    @property
    def score(self) -> int:
        return sum(r is True for r in self.right)

    @property
    def answered(self) -> int:
        return sum(r is not None for r in self.right)

    @property
    def total(self) -> int:
        return len(self.right)

    @property
    def complete(self) -> bool:
        return self.answered == self.total


def grade(questions: Sequence[Question], picks: Sequence[str | None]) -> Grade:
    """Each pick against its question's answer (picks in the questions' order; None: not answered yet)."""
    assert len(questions) == len(picks), (len(questions), len(picks))
    return Grade(tuple(q.is_right(p) for q, p in zip(questions, picks, strict=True)))


def summary(result: Grade) -> str:
    """One line for the student: how many right so far, or of how many."""
    if not result.answered:
        return f"Answer the {result.total} questions to see what you got right."
    if not result.complete:
        return f"{result.answered} of {result.total} answered, {result.score} right so far."
    return f"You got {result.score} of {result.total} right."


def progress_line(before: Grade, after: Grade) -> str | None:
    """At the end: the score now beside the score at the start, once both checks are complete; else None."""
    if not (before.complete and after.complete):
        return None
    change = after.score - before.score
    how = "the same as" if change == 0 else f"{abs(change)} {'more' if change > 0 else 'fewer'} than"
    return f"At the start you got {before.score} of {before.total}; now {after.score}: {how} at the start."


CONCEPT_CHECK: tuple[Question, ...] = (
    Question(
        "What does a Vision Transformer do first with an image?",
        ("Cuts it into square patches and turns each patch into a vector",
         "Slides many small convolutions over it, layer after layer",
         "Reads its pixels one at a time, left to right",
         "Finds the edges, then classifies the edges"),
        0, "Each patch becomes one token, like a word in a sentence: one linear map does it for every patch."),
    Question(
        "How does the model know where in the image a patch came from?",
        ("It doesn't need to: attention sees the picture directly",
         "The patches are fed in order, so it counts them",
         "A learned position vector is added to each patch's vector",
         "Each patch's pixel coordinates are appended as two numbers"),
        2, "Attention treats its tokens as a set; the learned position embedding is what tells them apart."),
    Question(
        "In one attention head, what is a token's row of attention weights?",
        ("The class probabilities for that token",
         "How much the token takes from every token, weights that sum to 1",
         "Which of its pixels are brightest",
         "How far the token is from the image's centre"),
        1, "$\\mathrm{softmax}(QK^\\top/\\sqrt{d})$: one row per query token, one weight per key token."),
    Question(
        "In a trained ViT, how far do the attention heads look?",
        ("Every head looks only at its neighbours, like a convolution",
         "Every head spreads its attention evenly over the whole image",
         "Only the last layer looks beyond a single patch",
         "Some heads in early layers already look across the image, and deeper layers look far"),
        3, "The mean attention distance (paper Fig. 7, right) spreads widely in early layers and grows with depth."),
    Question(
        "A relevance map highlights some patches. How can you test whether it explains the prediction?",
        ("Check that it looks like the object",
         "Delete the patches it ranks highest first: the class probability should fall faster than for random orders",
         "Compare it with the attention of the first layer",
         "Make sure its colours sum to 1"),
        1, "A map can look convincing and still be wrong: the deletion test asks the model itself."),
)
