"""Configs written for other frameworks (EasyR1, NeMo RL), read as rlstack's before the config is built."""
