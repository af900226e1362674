# A worker image: Debian 12 with Python, a venv holding exactly the fleet's locked dependencies
# (requirements.lock, installed with --require-hashes) and the startup script baked in, so a
# VM's boot skips apt-get and pip (startup.sh sees the stamp in the venv match the lock of the
# code it downloads; other code installs at boot). No compiler and no tokenizer C core: the
# C core is built where fleet is installed (setup.py) and travels with each code version that
# `fleet sync` uploads, so an image never holds one built from another wordpiece.c.
#
#   packer init images/packer && packer build -var project_id=MY_PROJECT images/packer
#
# Then set image = "projects/MY_PROJECT/global/images/family/fleet-worker" in fleet.toml.

packer {
  # required_plugins and `packer init` came with Packer 1.7; the googlecompute plugin wants a recent core.
  required_version = ">= 1.7.0"
  required_plugins {
    googlecompute = {
      version = ">= 1.1.4"
      source  = "github.com/hashicorp/googlecompute"
    }
  }
}

variable "project_id" {
  type        = string
  description = "Project that builds and owns the image"
}

variable "zone" {
  type    = string
  default = "us-central1-a"
}

variable "image_family" {
  type    = string
  default = "fleet-worker"
}

variable "source_image_family" {
  type    = string
  default = "debian-12"
}

locals {
  stamp = formatdate("YYYYMMDDhhmmss", timestamp())
  # What startup.sh expects (its FLEET_PYTHON default and its stamp file): tests/test_packer.py checks both.
  python     = "/opt/fleet/venv/bin/python"
  stamp_file = "/opt/fleet/venv/fleet-lock.sha256"
}

source "googlecompute" "worker" {
  project_id              = var.project_id
  zone                    = var.zone
  source_image_family     = var.source_image_family
  source_image_project_id = ["debian-cloud"]
  machine_type            = "e2-standard-2"
  disk_size               = 20
  ssh_username            = "packer"
  image_name              = "${var.image_family}-${local.stamp}"
  image_family            = var.image_family
  image_description       = "fleet worker: Python venv with the fleet's dependencies at ${local.python}"
  image_labels = {
    fleet = "worker"
  }
}

build {
  sources = ["source.googlecompute.worker"]

  provisioner "file" {
    source      = "${path.root}/../../startup/startup.sh"
    destination = "/tmp/startup.sh"
  }

  provisioner "file" {
    source      = "${path.root}/../../requirements.lock"
    destination = "/tmp/requirements.lock"
  }

  # The same install step a stock VM runs at boot, so the image holds exactly what startup.sh checks for.
  provisioner "shell" {
    inline = [
      "sudo install -d -m 0755 /opt/fleet",
      "sudo install -m 0755 /tmp/startup.sh /opt/fleet/startup.sh",
      "sudo env FLEET_INSTALL_ONLY=/tmp/requirements.lock FLEET_PYTHON=${local.python} bash /opt/fleet/startup.sh",
      "test -x ${local.python} && test -s ${local.stamp_file}",
      "rm -f /tmp/startup.sh /tmp/requirements.lock",
    ]
  }
}
