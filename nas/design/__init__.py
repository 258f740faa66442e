"""LLM design strategies (NADER over block files, FairNAD over model source): the
`DesignStrategy` base they share, the verifier chain their drafts pass before
anything trains, and the design-quality metrics of their runs. Modules are
imported where used: the strategy registry names `nas.design.nader` and `nas.design.fairnad`."""
