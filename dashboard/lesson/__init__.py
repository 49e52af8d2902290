"""The lesson: the ViT paper's story told in ten steps on the live model and the user's own image or drawing.

    /lesson?step=N   (N = 1..10; a teacher can put the link to a step on a slide)

1 the image and its patches; 2 a patch becomes a vector (the patch-embedding filters); 3 where it is (position
embeddings); 4-6 attention: one head, all the heads of a layer, through the layers (rollout); 7 how far the heads
look (mean attention distance, paper Fig. 7 right); 8 the prediction; 9 why (a relevance map and the deletion test);
10 going further (interventions, logit lens, registers). Each step: one main figure (the explorer tab's own), two
or three sentences, a "Notice" and a "Try this" written with the live numbers, a predict-then-reveal question
where the idea allows one, Back and Next. A five-question concept check at the start and at the end says what the
student got right; answers stay in the browser session.

Modules: `steps` (each step's words and answers, pure), `facts` (the numbers they use, pure), `quiz` (questions and
grading, pure), `ui` (the Streamlit layout; the page script is dashboard/page_scripts/lesson.py).
"""
