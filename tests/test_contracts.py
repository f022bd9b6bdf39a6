"""The contract checker every family uses (core.contracts): members named, properties not evaluated."""

from __future__ import annotations

from typing import Protocol

import lightning as L
import pytest

from litlab.lit_modules.core.contracts import check_data, check_protocol, protocol_members
from litlab.lit_modules.core.errors import ContractError


class Sized(Protocol):
    size: int


class Data(Sized, Protocol):
    @property
    def tokenizer(self) -> object: ...

    def val_dataloader(self) -> object: ...

    def sample(self, n: int) -> list: ...


class Good(L.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.size = 3

    @property
    def tokenizer(self):
        raise AssertionError("a property must not be evaluated by the check")

    def val_dataloader(self):
        return []

    def sample(self, n):
        return [0] * n


class NoSample(Good):
    sample = 5  # not a method


class LightningDefault(L.LightningDataModule):  # val_dataloader only from Lightning's base: "not implemented"
    size = 1
    tokenizer = None

    def sample(self, n):
        return []


def test_members_in_declaration_order_bases_first():
    assert protocol_members(Data) == ["size", "tokenizer", "val_dataloader", "sample"]


def test_a_class_that_provides_everything_passes_without_evaluating_properties():
    check_protocol(Good(), Data, "TestModule")


@pytest.mark.parametrize(
    "obj,message",
    [
        (None, "TestModule needs an object providing .*Data"),
        (object(), "object lacks 'size', which TestModule needs"),
        (LightningDefault(), "LightningDefault lacks 'val_dataloader'"),
        (NoSample(), r"NoSample.sample must be a method"),
    ],
)
def test_a_missing_member_is_named_with_the_class(obj, message):
    with pytest.raises(ContractError, match=message):
        check_protocol(obj, Data, "TestModule")


def test_members_restricts_the_check():
    class OnlySize:
        size = 1

    check_protocol(OnlySize(), Data, "TestModule", members=["size"])


def test_check_data_is_the_one_datamodule_check_of_every_family():
    from litlab.lit_modules.analysis import contract as analysis_contract
    from litlab.lit_modules.continual import contract as continual_contract
    from litlab.lit_modules.diffusion import contract as diffusion_contract
    from litlab.lit_modules.domain import contract as domain_contract

    for family in (analysis_contract, continual_contract, diffusion_contract, domain_contract):
        assert family.check_data is check_data, family.__name__
    check_data(Good(), Data, "TestModule")
    with pytest.raises(ContractError, match="LightningDefault lacks 'val_dataloader'.*until setup\\(\\) ran"):
        check_data(LightningDefault(), Data, "TestModule")
