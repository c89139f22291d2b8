"""The lab: a fictional multi-hop world whose questions need real retrieval (hops) and real reasoning
(operations), each measurable on its own. world.py: entities, passages, the Search-R1 corpus;
questions.py: questions with the two dials and check_answer."""
