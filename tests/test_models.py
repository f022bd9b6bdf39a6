import pytest
import torch

from litlab.lit_modules.core.models import TinyCNN, TinyGPT, TinyViT, tiny_llama


def test_tiny_gpt_shapes_and_adapter_target_names():
    model = TinyGPT(vocab_size=97, d_model=32, n_layers=2, n_heads=4, block_size=16)
    logits = model(torch.randint(0, 97, (3, 16)))
    assert logits.shape == (3, 16, 97)
    modules = dict(model.named_modules())
    for i in range(2):
        for name in (
            "attn.q_proj",
            "attn.k_proj",
            "attn.v_proj",
            "attn.o_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ):
            assert isinstance(modules[f"blocks.{i}.{name}"], torch.nn.Linear)
    assert isinstance(modules["lm_head"], torch.nn.Linear)


def test_tiny_gpt_is_causal():
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=20, d_model=32, n_heads=4, block_size=12).eval()
    ids = torch.randint(0, 20, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] + 1) % 20
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_tiny_gpt_errors_name_the_bad_numbers():
    model = TinyGPT(block_size=8)
    with pytest.raises(ValueError, match=r"T=9.*block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"d_model=30.*n_heads=4"):
        TinyGPT(d_model=30, n_heads=4)


def test_tiny_llama_forward_and_size():
    model = tiny_llama(vocab_size=97)
    out = model(input_ids=torch.randint(0, 97, (2, 10)))
    assert out.logits.shape == (2, 10, 97)
    n_params = sum(p.numel() for p in model.parameters())
    # Untied embeddings dominate: 2 * 97 * 64 plus two small layers.
    assert 50_000 < n_params < 300_000
    assert model.config.tie_word_embeddings is False
    assert "model.layers.0.self_attn.q_proj" in dict(model.named_modules())


def test_tiny_vit_image_mode():
    model = TinyViT(image_size=8, patch_size=2, in_channels=1, width=32, num_classes=10)
    x = torch.randn(4, 1, 8, 8)
    assert model(x).shape == (4, 10)
    assert model.forward_features(x).shape == (4, 32)
    modules = dict(model.named_modules())
    assert modules["blocks.0.attn.qkv"].out_features == 3 * 32
    for name in ("blocks.1.attn.proj", "blocks.1.mlp.fc1", "blocks.1.mlp.fc2"):
        assert name in modules


def test_tiny_vit_token_mode_returns_features_without_head():
    model = TinyViT(width=32, token_dim=12, num_tokens=5)
    assert model(torch.randn(3, 5, 12)).shape == (3, 32)
    with pytest.raises(ValueError, match="num_tokens"):
        TinyViT(token_dim=12)


@pytest.mark.parametrize("size", [8, 28])
def test_tiny_cnn_handles_digits_and_mnist_sizes(size):
    model = TinyCNN(in_channels=1, num_classes=10, width=8)
    assert model(torch.randn(2, 1, size, size)).shape == (2, 10)
    assert isinstance(model.head, torch.nn.Linear)
