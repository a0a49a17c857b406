"""Python references of the example extensions' ops (what ``wb adopt --reference`` names)."""

import torch


def mymuladd(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    return a * b + c


def mymul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b


def myadd_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    torch.add(a, b, out=out)


def myrelu(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_min(0)


def myaxpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + y


def scale_rows(x: torch.Tensor, s: float) -> torch.Tensor:
    rows = torch.arange(1, x.shape[0] + 1, dtype=torch.float64, device=x.device)
    return (x.double() * s * rows[:, None]).to(x.dtype)
