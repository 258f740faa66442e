"""Zero-cost proxies: scores of a freshly initialised network on one minibatch that rank
architectures without training them (synflow, snip, grad_norm, jacob_cov, naswot, params) and
their rank `vote`. Torch lives here, never in the core."""

from nas.proxies.base import PROXIES, VOTE, Batch, Proxy
from nas.proxies.vote import mean_rank, score_arch, score_network, vote_scores

__all__ = ["PROXIES", "VOTE", "Batch", "Proxy", "mean_rank", "score_arch", "score_network", "vote_scores"]
