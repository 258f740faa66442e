"""What the LLM design strategies share (NADER over block files, FairNAD over model source;
each in its folder under `nas/agents/`): the `DesignStrategy` base, the verifier chain their
drafts pass before anything trains, kept sandbox verdicts, and the design-quality metrics."""
