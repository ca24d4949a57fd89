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
