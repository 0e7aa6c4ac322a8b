//! OpenPGP keys and signatures made with sequoia at test time.

use std::io::Write;

use openpgp::cert::prelude::*;
use openpgp::policy::StandardPolicy;
use openpgp::serialize::stream::{Armorer, Message, Signer};
use openpgp::serialize::SerializeInto;
use sequoia_openpgp as openpgp;

pub struct Signer_ {
    pub cert: Cert,
}

impl Signer_ {
    pub fn new(uid: &str) -> Signer_ {
        let (cert, _) = CertBuilder::general_purpose(Some(uid)).generate().unwrap();
        Signer_ { cert }
    }

    /// The public keyring, armored.
    pub fn keyring(&self) -> Vec<u8> {
        self.cert.armored().to_vec().unwrap()
    }

    /// An armored detached signature over `data`.
    pub fn sign(&self, data: &[u8]) -> Vec<u8> {
        self.sign_as(data, true)
    }

    /// A binary detached signature over `data` (what `gpg --detach-sign` writes to a `.gpg`).
    pub fn sign_binary(&self, data: &[u8]) -> Vec<u8> {
        self.sign_as(data, false)
    }

    fn sign_as(&self, data: &[u8], armored: bool) -> Vec<u8> {
        let p = StandardPolicy::new();
        let keypair = self
            .cert
            .keys()
            .with_policy(&p, None)
            .supported()
            .alive()
            .revoked(false)
            .for_signing()
            .next()
            .unwrap()
            .key()
            .clone()
            .parts_into_secret()
            .unwrap()
            .into_keypair()
            .unwrap();
        let mut sink = Vec::new();
        {
            let m = Message::new(&mut sink);
            let m = if armored {
                Armorer::new(m)
                    .kind(openpgp::armor::Kind::Signature)
                    .build()
                    .unwrap()
            } else {
                m
            };
            let mut s = Signer::new(m, keypair).unwrap().detached().build().unwrap();
            s.write_all(data).unwrap();
            s.finalize().unwrap();
        }
        sink
    }
}
