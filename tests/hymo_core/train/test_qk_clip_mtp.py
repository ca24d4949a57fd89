"""QK-Clip reaches the MLA blocks inside MTP: they train on NorMuon like the trunk's."""
import pytest
import torch

from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.trainer import QKClip

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_mtp_mla_blocks_are_probed_and_clipped():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=48,
                                    max_seq_len=16, layer_pattern="GM", mtp_depth=2))
    mtp_mixers = [depth.block.attn for depth in model.mtp.depths]
    assert model.softmax_mixers() == [model.layers[1].attn, *mtp_mixers]
    model.train()
    model.set_attention_probe(True)
    tokens = torch.randint(0, 61, (2, 13), generator=torch.Generator().manual_seed(1))
    model(tokens[:, :-1], tokens[:, 1:])
    maxima_LH = model.attention_max_logits()
    assert maxima_LH.shape == (3, 4) and bool((maxima_LH > 0).all())
    before = [m.q_b_proj.weight.detach().clone() for m in mtp_mixers]
    clip = QKClip(model, threshold=float(maxima_LH[1:].min()) / 2, enabled=True)
    clip.observe()
    assert int(clip.apply()) >= 8  # every MTP head is over the threshold
    for mixer, old in zip(mtp_mixers, before):
        assert not torch.equal(mixer.q_b_proj.weight, old)
    model.eval()  # an evaluation forward does not run MTP: its probe says so rather than reading stale maxima
    model.set_attention_probe(False)
    model.set_attention_probe(True)
    model(tokens)
    with pytest.raises(RuntimeError, match="training forward"):
        model.attention_max_logits()


@pytest.mark.parametrize("clipped", [False, True], ids=["nothing_clipped", "every_head_clipped"])
def test_qk_clip_rescale_launches_are_counted_and_do_not_branch(clipped):
    """The rescale of L MLA layers is 2 L + a few launches (the row factors of every layer at once), the same with
    and without a head over the threshold, and reads nothing back (issue 54). Counted on hymo-750m's 10 MLA layers
    (8 trunk + 2 MTP) on the meta device: the old per-layer rescale launched 6 per layer."""
    from hymo_core.train.block_budget import meta_model
    from hymo_core.train.host_sync import HostSyncCounter
    from hymo_core.train.launch_count import LaunchCounter

    model = meta_model()
    L = len(model.softmax_mixers())
    assert L == 10
    clip = QKClip(model, threshold=100.0, enabled=True)
    clip.maxima_LH = torch.full((L, model.config.n_heads), 150.0 if clipped else 50.0, device="meta")
    with HostSyncCounter() as syncs, LaunchCounter() as counter:
        clip.apply()
    assert syncs.events == []
    # gt, where (+ its ones), div, the factors (unsqueeze-free: sqrt, ones, 2 cats), 2 L multiplies, the count's sum
    assert counter.launches() <= 2 * L + 10, counter.top(20)


def test_qk_clip_batched_rescale_equals_per_layer():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=48,
                                    max_seq_len=16, layer_pattern="MM"))
    mixers = model.softmax_mixers()
    gamma_LH = torch.tensor([[1.0, 0.5, 1.0, 0.25], [0.9, 1.0, 1.0, 1.0]])
    one_by_one = [[p.detach().clone() for p in (m.q_b_proj.weight, m.kv_b_proj.weight)] for m in mixers]
    for m, (q, kv) in zip(mixers, one_by_one):  # the rule, written out: nope rows by sqrt, rope rows by gamma, v rows 1
        H, N, R, V = m.n_heads, m.nope_dim, m.rope_dim, m.v_dim
        g = gamma_LH[mixers.index(m)]
        q.view(H, N + R, -1)[:, :N] *= g.sqrt()[:, None, None]
        q.view(H, N + R, -1)[:, N:] *= g[:, None, None]
        kv.view(H, N + V, -1)[:, :N] *= g.sqrt()[:, None, None]
    type(mixers[0]).qk_clip_all_(mixers, gamma_LH)
    for m, (q, kv) in zip(mixers, one_by_one):
        torch.testing.assert_close(m.q_b_proj.weight, q)
        torch.testing.assert_close(m.kv_b_proj.weight, kv)
