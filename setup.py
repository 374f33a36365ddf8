"""gms_kernels: fast, correct Gaussian Mixture Solvers for diffusion models."""
from setuptools import find_packages, setup

setup(
    name="gms_kernels",
    version="0.1.0",
    description="Gaussian Mixture Solvers (GMS) for diffusion-model sampling: reference, fused kernels, CLI",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["gms_kernels", "gms_kernels.*"]),
    install_requires=[
        "torch>=2.1",  # 2.13.0 (the local CPU wheel) satisfies it; install torch first to avoid a CUDA build
        "numpy>=1.23",
        "tqdm>=4.60",
        "matplotlib>=3.6",
    ],
    extras_require={
        "test": ["pytest>=7"],
        "bench": ["pytest-benchmark>=4"],
    },
    entry_points={"console_scripts": ["gms-kernels=gms_kernels.cli:main"]},
)
