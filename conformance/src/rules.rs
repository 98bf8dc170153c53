//! One public function per rule of CONTRACT.md, named after it.
