from setuptools import find_packages, setup

setup(
    name="gas",
    version="0.1.0",
    description="GPU-aware scheduler extender for Kubernetes: shares GPUs between pods per card",
    python_requires=">=3.11",
    packages=find_packages(include=["gas", "gas.*"]),
    package_data={"gas": ["data/*.yaml", "py.typed"]},
    install_requires=[
        "flask>=3.0",
        "gunicorn>=22.0",
        "kubernetes>=29.0",
        "orjson>=3.9",
        "cryptography>=42.0",
        "requests>=2.31",
        "pyyaml>=6.0",
        "prometheus-client>=0.20",
        "numpy>=2.0",
    ],
    extras_require={
        "labeler": ["pyudev>=0.24"],
        # `gas node`: the kubelet device plugin (gRPC) and card discovery. The generated
        # modules in gas/node/api check these runtime versions when imported.
        "node": ["grpcio>=1.85.1", "protobuf>=7.35.1", "pyudev>=0.24"],
        "test": [
            "pytest>=8.0",
            "pytest-timeout>=2.3",
            "hypothesis>=6.100",
            "ruff>=0.6",
            "mypy>=1.10",
            "types-requests",
            "types-pyyaml",
            "types-grpcio",
            "types-protobuf",
            # scripts/gen-protos.sh: the generated code names these versions, and the
            # staleness test regenerates it, so they are pinned.
            "grpcio-tools==1.85.1",
            "mypy-protobuf==5.1.0",
        ],
    },
    entry_points={
        "console_scripts": [
            "gas=gas.cli:main",
            # kubectl runs any `kubectl-NAME` on PATH as `kubectl NAME`.
            "kubectl-gas=gas.tools.inspector.command:kubectl_main",
        ]
    },
)
