"""Pushing a PPO run's policy to the Hugging Face Hub (`--push_to_hub`, `--hub_model_id`): every
checkpoint's policy into a folder `checkpoint-N` of the repository, the final policy at its root."""

from __future__ import annotations

from pathlib import Path


def repo_id(args) -> str:
    """`--hub_model_id`, else the name of OUTPUT_DIR (as `transformers.Trainer` does)."""
    return args.hub_model_id or Path(args.output_dir).name


def push_folder(args, folder: Path, path_in_repo: str | None, message: str) -> None:
    """Upload `folder` to the run's model repository (created when absent), under `path_in_repo`."""
    from huggingface_hub import HfApi

    api = HfApi(token=args.hub_token)
    repo = api.create_repo(repo_id(args), private=args.hub_private_repo, exist_ok=True, repo_type="model")
    api.upload_folder(repo_id=getattr(repo, "repo_id", repo_id(args)), folder_path=str(folder),
                      path_in_repo=path_in_repo, commit_message=message, repo_type="model")
