pub mod annotation;
