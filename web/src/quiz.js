// Questions on the page: a step's predict-then-reveal question and the five-question concept check (the Streamlit
// lesson's, from lesson.json), graded in the page; answers stay in this browser tab.

import { escape } from "./lesson.js";

/** The lesson's few LaTeX formulas as plain text (the Streamlit page renders them; this page has no TeX). */
export const plainMath = (text) => text.replace(/\$/g, "").replace(/\\mathrm\{(\w+)\}/g, "$1").replace(/\^\\top/g, "\u1d40")
  .replace(/\\sqrt\{(\w+)\}/g, "\u221a$1");

/** A question as radio buttons; `onPick(index)` when one is picked. */
export function choices(q, name, picked, onPick) {
  const box = document.createElement("fieldset");
  box.className = "question";
  box.innerHTML = `<legend>${q.prompt}</legend>`;
  q.options.forEach((option, i) => {
    const label = document.createElement("label");
    label.innerHTML = `<input type="radio" name="${name}" value="${i}" ${picked === i ? "checked" : ""}> ${escape(option)}`;
    label.querySelector("input").addEventListener("change", () => onPick(i));
    box.append(label);
  });
  return box;
}

/** The predict-then-reveal block of a step: the question, a Reveal button, then right or not and the reveal text. */
export function predictThenReveal(q, reveal, key, state, rerender) {
  const box = document.createElement("div");
  const picked = state.picks[key];
  box.append(choices(q, key, picked, (i) => { state.picks[key] = i; }));
  const button = document.createElement("button");
  button.textContent = "Reveal";
  button.className = "reveal";
  button.addEventListener("click", () => { state.revealed[key] = true; rerender(); });
  box.append(button);
  if (state.revealed[key]) {
    const right = picked === q.answer;
    const p = document.createElement("p");
    p.className = "answer";
    p.innerHTML = `${picked === undefined ? "" : right ? "Right. " : "Not quite. "}<b>${escape(q.options[q.answer])}</b>: ${reveal}`;
    box.append(p);
  }
  return box;
}

/** Score of picks against questions: {score, answered, total}. */
export function grade(questions, picks) {
  const answered = questions.filter((_, i) => picks[i] !== undefined).length;
  return { score: questions.filter((q, i) => picks[i] === q.answer).length, answered, total: questions.length };
}

/** dashboard.lesson.quiz.summary. */
export function summary(g) {
  if (!g.answered) return `Answer the ${g.total} questions to see what you got right.`;
  if (g.answered < g.total) return `${g.answered} of ${g.total} answered, ${g.score} right so far.`;
  return `You got ${g.score} of ${g.total} right.`;
}

/** dashboard.lesson.quiz.progress_line. */
export function progressLine(before, after) {
  if (before.answered < before.total || after.answered < after.total) return null;
  const change = after.score - before.score;
  const how = change === 0 ? "the same as" : `${Math.abs(change)} ${change > 0 ? "more" : "fewer"} than`;
  return `At the start you got ${before.score} of ${before.total}; now ${after.score}: ${how} at the start.`;
}

/** The concept check: every question, the summary, and once all are answered each one's answer and why. */
export function conceptCheck(questions, picks, name, rerender, other = null) {
  const box = document.createElement("div");
  box.className = "concept-check";
  questions.forEach((q, i) => {
    box.append(choices(q, `${name}-${i}`, picks[i], (pick) => { picks[i] = pick; rerender(); }));
  });
  const g = grade(questions, picks);
  const line = document.createElement("p");
  line.className = "summary";
  line.textContent = summary(g);
  box.append(line);
  if (g.answered === g.total) {
    const list = document.createElement("ol");
    for (const q of questions) {
      const li = document.createElement("li");
      li.innerHTML = `<b>${escape(q.options[q.answer])}</b>. ${escape(plainMath(q.why))}`;
      list.append(li);
    }
    box.append(list);
    if (other) {
      const progress = progressLine(grade(questions, other), g);
      if (progress) { const p = document.createElement("p"); p.className = "summary"; p.textContent = progress; box.append(p); }
    }
  }
  return box;
}
