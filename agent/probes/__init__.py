"""Probes: short active measurements (GEMM, memory bandwidth, PCIe, NCCL)."""
